/* toytask.h - a training task for the GPU suites (test_cuda_train, test_server_gpu), needing no data files: example
 * i of a split is a row of 4 + i % 9 random ids below the model's vocabulary (seeded by the split and i), its class
 * ids[0] % 2, its targets the next ids; TOY_EXAMPLES examples a split. toy_lm is a causal LM on it, toy_cls a
 * classification into 2 classes. */
#ifndef SEPAL_TESTS_TOYTASK_H
#define SEPAL_TESTS_TOYTASK_H

#include "sepal/plugin.h"

#define TOY_EXAMPLES 24

extern const sepal_task toy_lm, toy_cls;

#endif

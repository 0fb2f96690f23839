/* span_none.c - span.h in a build without CUDA: --device cuda is refused at start ("built without CUDA"), so no
 * other span_dev_* call is ever reached (each says so if it were). */
#include "span.h"

#define NO_CUDA "no usable GPU (this sepal-server was built without CUDA)"

sp_status sp_device_probe(int gpu, sp_err *err)
{
    (void)gpu;
    return sp_errf(err, SP_ERR_UNSUPPORTED, NO_CUDA);
}

sp_status span_dev_open(sp_server *s, int gpu, sp_err *err)
{
    (void)s;
    return sp_device_probe(gpu, err);
}

int sp_server_has_cuda(void) { return 0; }
void span_dev_close(sp_server *s) { (void)s; }
size_t span_dev_weight_bytes(const sp_server *s) { (void)s; return 0; }

sp_status span_dev_forward(sp_server *s, int start, int end, float *x, int B, int T, const float *prompts, int P,
                           float *inputs, sp_err *err)
{
    (void)s, (void)start, (void)end, (void)x, (void)B, (void)T, (void)prompts, (void)P, (void)inputs;
    return sp_errf(err, SP_ERR_UNSUPPORTED, NO_CUDA);
}

size_t span_dev_kept_bytes(const sp_server *s, int start, int end, int B, int T)
{
    (void)s, (void)start, (void)end, (void)B, (void)T;
    return 0;
}

size_t span_dev_room(const sp_server *s) { (void)s; return 0; }
size_t span_dev_budget_used(const sp_server *s) { (void)s; return 0; }
void span_dev_kept_free(span_dev_kept *k) { (void)k; }
size_t span_dev_kept_size(const span_dev_kept *k) { (void)k; return 0; }

sp_status span_dev_forward_keep(sp_server *s, int start, int end, float *x, int B, int T, const float *prompts, int P,
                                span_dev_kept **out, sp_err *err)
{
    (void)s, (void)start, (void)end, (void)x, (void)B, (void)T, (void)prompts, (void)P;
    *out = NULL;
    return sp_errf(err, SP_ERR_UNSUPPORTED, NO_CUDA);
}

sp_status span_dev_backward(sp_server *s, int start, int end, float *g, const float *x, const float *inputs,
                            const span_dev_kept *dk, int B, int T, const float *prompts, int P, float *gp,
                            sp_err *err)
{
    (void)s, (void)start, (void)end, (void)g, (void)x, (void)inputs, (void)dk, (void)B, (void)T, (void)prompts,
        (void)P, (void)gp;
    return sp_errf(err, SP_ERR_UNSUPPORTED, NO_CUDA);
}

sp_status span_dev_kv_open(sp_server *s, session *x, int start, int end, int B, int max_length, sp_err *err)
{
    (void)s, (void)x, (void)start, (void)end, (void)B, (void)max_length;
    return sp_errf(err, SP_ERR_UNSUPPORTED, NO_CUDA);
}

void span_dev_kv_free(session *x) { (void)x; }

sp_status span_dev_step(sp_server *s, session *x, float *h, int B, int T, const float *prompts, int P, sp_err *err)
{
    (void)s, (void)x, (void)h, (void)B, (void)T, (void)prompts, (void)P;
    return sp_errf(err, SP_ERR_UNSUPPORTED, NO_CUDA);
}

sp_status span_dev_reorder(sp_server *s, session *x, const int64_t *hypo, sp_err *err)
{
    (void)s, (void)x, (void)hypo;
    return sp_errf(err, SP_ERR_UNSUPPORTED, NO_CUDA);
}

sp_status span_dev_decode_batch(sp_server *s, session *const *xs, int n, float *h, int rows, sp_err *err)
{
    (void)s, (void)xs, (void)n, (void)h, (void)rows;
    return sp_errf(err, SP_ERR_UNSUPPORTED, NO_CUDA);
}

void span_dev_measure(sp_server *s, int T, int past, double *rps, double *tps)
{
    (void)s, (void)T, (void)past;
    *rps = *tps = 0;
}

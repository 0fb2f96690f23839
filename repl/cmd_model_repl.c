/* cmd_model_repl.c - `model SUBCOMMAND ...` in the REPL: the same code as `sepal model ...` (cmd_model.c). */
#include "app.h"
#include "cli.h"

static int cmd_model_repl(sp_app *app, int argc, char **argv)
{
    return cmd_model(argc - 1, argv + 1) == CLI_OK ? 0 : 1; /* cmd_model prints its own messages */
}

const sp_cmd sp_cmds_model[] = {
    {"model", NULL, "info|check|generate|convert-llama2c ...", "inspect, check or run a model directory locally",
     "model info DIR                        architecture, sizes, parameter count, dtypes\n"
     "model check DIR [--golden FILE]       run the model locally against golden outputs\n"
     "model generate DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--seed S]\n"
     "                                      generate in this process, without the swarm\n"
     "model convert-llama2c MODEL.bin TOKENIZER.bin OUTDIR\n"
     "                                      convert a llama2.c checkpoint to a Hugging Face directory\n",
     cmd_model_repl},
    {0},
};

/* cmdline.h - the `:` line: an editor (UTF-8), a history (browsed with Up/Down, the line being typed kept), and
 * completion from the command layer (the same candidates as the line REPL's Tab). Driven by key codes, so the
 * tests type into it without a terminal. */
#ifndef SEPAL_TUI_CMDLINE_H
#define SEPAL_TUI_CMDLINE_H

#include <stddef.h>

#include "cmd.h"

#define TUI_CMDLINE_MAX 2048

/* The candidates for the word before the cursor of line[0..cursor): into out (each the whole word), its start
 * in *word_start; *files: they are file names (no space after a directory). */
typedef void (*tui_complete_fn)(void *ctx, const char *line, size_t cursor, sp_strlist *out, size_t *word_start,
                                int *files);

typedef struct tui_cmdline {
    char buf[TUI_CMDLINE_MAX];
    size_t len, cur;          /* bytes */
    char **hist;
    int nhist, caphist, hpos; /* hpos == nhist: the line being typed */
    char saved[TUI_CMDLINE_MAX];
    tui_complete_fn complete;
    void *complete_ctx;
    sp_strlist cands;         /* cycling through these with Tab */
    int cand_i, cycling;
    size_t cand_start;
    char msg[512];            /* shown beside the line: the candidates, "no completion" */
} tui_cmdline;

enum { TUI_CL_NONE, TUI_CL_CHANGED, TUI_CL_RUN, TUI_CL_CANCEL };

void tui_cmdline_init(tui_cmdline *c, tui_complete_fn complete, void *ctx);
void tui_cmdline_free(tui_cmdline *c);
/* A fresh, empty line (history position at its end). */
void tui_cmdline_open(tui_cmdline *c);
/* One key: a character (a code point) or an editing action of the key table (keys.h's TUI_A_CMD_*; pass
 * ch < 0 then). Returns TUI_CL_*; on TUI_CL_RUN the line (buf) is in the history. */
int tui_cmdline_key(tui_cmdline *c, int action, long ch);
/* Adds a line to the history (not an empty one, nor the same as the last). */
void tui_cmdline_add_history(tui_cmdline *c, const char *line);
/* History from / to a file: one line each, the last 1000 kept. */
void tui_cmdline_load(tui_cmdline *c, const char *path);
void tui_cmdline_save(const tui_cmdline *c, const char *path);

#endif

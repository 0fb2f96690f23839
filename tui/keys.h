/* keys.h - every key binding in one table: the loop looks keys up in it, and the help overlay is generated
 * from it, so the two cannot disagree. Key codes are ncurses' (KEY_UP ...) or characters. */
#ifndef SEPAL_TUI_KEYS_H
#define SEPAL_TUI_KEYS_H

/* Where a binding applies. A panel's context is looked at before the global one. */
enum {
    TUI_CTX_GLOBAL = 1,  /* normal mode, any panel */
    TUI_CTX_SWARM = 2,   /* the swarm panel focused */
    TUI_CTX_SCROLL = 4,  /* the log or generation panel focused */
    TUI_CTX_TRAIN = 8,   /* the training panel focused */
    TUI_CTX_CMD = 16,    /* typing at the `:` line (every printable key is text there) */
    TUI_CTX_HELP = 32,   /* the help overlay */
    TUI_CTX_CONFIRM = 64 /* the quit confirmation */
};

typedef enum tui_action {
    TUI_A_NONE,
    TUI_A_QUIT, TUI_A_INTR, TUI_A_HELP, TUI_A_CMDLINE, TUI_A_FOCUS_NEXT, TUI_A_FOCUS_PREV,
    TUI_A_FOCUS1, TUI_A_FOCUS2, TUI_A_FOCUS3, TUI_A_FOCUS4, TUI_A_FOCUS5,
    TUI_A_ZOOM, TUI_A_REDRAW, TUI_A_PAUSE,
    TUI_A_UP, TUI_A_DOWN, TUI_A_PGUP, TUI_A_PGDN, TUI_A_HOME, TUI_A_END,
    TUI_A_SORT, TUI_A_SORT_REV, TUI_A_SERIES, TUI_A_LOGY,
    TUI_A_CMD_RUN, TUI_A_CMD_COMPLETE, TUI_A_CMD_PREV, TUI_A_CMD_NEXT, TUI_A_CMD_CANCEL,
    TUI_A_CMD_LEFT, TUI_A_CMD_RIGHT, TUI_A_CMD_BOL, TUI_A_CMD_EOL, TUI_A_CMD_BS, TUI_A_CMD_DEL,
    TUI_A_CMD_KILL_BOL, TUI_A_CMD_KILL_EOL, TUI_A_CMD_KILL_WORD,
    TUI_A_CLOSE, TUI_A_YES, TUI_A_NO,
    TUI_A_COUNT
} tui_action;

#define TUI_KEY_VISIBLE 1 /* listed in the help */
#define TUI_KEY_SIGINT (-3) /* Ctrl-C arrives as SIGINT, not as a key: listed for the help only */

typedef struct tui_key {
    unsigned ctx;
    int key;
    const char *name; /* as the help shows it: "q", "F10", "Ctrl-L" */
    const char *help;
    tui_action action;
    unsigned flags;
} tui_key;

extern const tui_key tui_keys[];
extern const int tui_nkeys;

/* The action of key in the contexts of mask (the more specific context first); TUI_A_NONE if unbound. */
tui_action tui_key_action(unsigned mask, int key);
/* The help overlay's lines, generated from the table (one per action and context, keys joined: "q F10  quit");
 * *lines is malloc'd (free each line and the array). Returns the count. */
int tui_help_lines(char ***lines);
/* The name of a context ("global", "swarm", ...). */
const char *tui_ctx_name(unsigned ctx);

#endif

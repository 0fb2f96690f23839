/* keys.c - the key table, lookups and the help it generates. */
#define NCURSES_WIDECHAR 1
#include "keys.h"

#include <curses.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V TUI_KEY_VISIBLE
#define CTRL(c) ((c) & 0x1f)

/* Panel contexts come first: a lookup takes the first match among the contexts asked for. */
const tui_key tui_keys[] = {
    /* the `:` line: printable keys are text, these edit */
    {TUI_CTX_CMD, '\r', "Enter", "run the line as shown", TUI_A_CMD_RUN, V},
    {TUI_CTX_CMD, '\n', "Enter", "run the line as shown", TUI_A_CMD_RUN, 0},
    {TUI_CTX_CMD, KEY_ENTER, "Enter", "run the line as shown", TUI_A_CMD_RUN, 0},
    {TUI_CTX_CMD, '\t', "Tab", "complete (again: the next candidate)", TUI_A_CMD_COMPLETE, V},
    {TUI_CTX_CMD, KEY_UP, "Up", "the previous line of the history", TUI_A_CMD_PREV, V},
    {TUI_CTX_CMD, CTRL('P'), "Ctrl-P", "the previous line of the history", TUI_A_CMD_PREV, V},
    {TUI_CTX_CMD, KEY_DOWN, "Down", "the next line of the history", TUI_A_CMD_NEXT, V},
    {TUI_CTX_CMD, CTRL('N'), "Ctrl-N", "the next line of the history", TUI_A_CMD_NEXT, V},
    {TUI_CTX_CMD, 27, "Esc", "leave the line (it is kept in the history)", TUI_A_CMD_CANCEL, V},
    {TUI_CTX_CMD, CTRL('G'), "Ctrl-G", "leave the line (it is kept in the history)", TUI_A_CMD_CANCEL, V},
    {TUI_CTX_CMD, KEY_LEFT, "Left", "move left", TUI_A_CMD_LEFT, V},
    {TUI_CTX_CMD, CTRL('B'), "Ctrl-B", "move left", TUI_A_CMD_LEFT, V},
    {TUI_CTX_CMD, KEY_RIGHT, "Right", "move right", TUI_A_CMD_RIGHT, V},
    {TUI_CTX_CMD, CTRL('F'), "Ctrl-F", "move right", TUI_A_CMD_RIGHT, V},
    {TUI_CTX_CMD, CTRL('A'), "Ctrl-A", "to the start of the line", TUI_A_CMD_BOL, V},
    {TUI_CTX_CMD, KEY_HOME, "Home", "to the start of the line", TUI_A_CMD_BOL, V},
    {TUI_CTX_CMD, CTRL('E'), "Ctrl-E", "to the end of the line", TUI_A_CMD_EOL, V},
    {TUI_CTX_CMD, KEY_END, "End", "to the end of the line", TUI_A_CMD_EOL, V},
    {TUI_CTX_CMD, KEY_BACKSPACE, "Backspace", "delete the character before the cursor", TUI_A_CMD_BS, V},
    {TUI_CTX_CMD, 127, "Backspace", "delete the character before the cursor", TUI_A_CMD_BS, 0},
    {TUI_CTX_CMD, CTRL('H'), "Ctrl-H", "delete the character before the cursor", TUI_A_CMD_BS, 0},
    {TUI_CTX_CMD, KEY_DC, "Delete", "delete the character under the cursor", TUI_A_CMD_DEL, V},
    {TUI_CTX_CMD, CTRL('D'), "Ctrl-D", "delete the character under the cursor", TUI_A_CMD_DEL, V},
    {TUI_CTX_CMD, CTRL('U'), "Ctrl-U", "delete to the start of the line", TUI_A_CMD_KILL_BOL, V},
    {TUI_CTX_CMD, CTRL('K'), "Ctrl-K", "delete to the end of the line", TUI_A_CMD_KILL_EOL, V},
    {TUI_CTX_CMD, CTRL('W'), "Ctrl-W", "delete the word before the cursor", TUI_A_CMD_KILL_WORD, V},
    /* the help overlay */
    {TUI_CTX_HELP, 27, "Esc", "close the help", TUI_A_CLOSE, V},
    {TUI_CTX_HELP, 'q', "q", "close the help", TUI_A_CLOSE, V},
    {TUI_CTX_HELP, '?', "?", "close the help", TUI_A_CLOSE, V},
    {TUI_CTX_HELP, KEY_F(1), "F1", "close the help", TUI_A_CLOSE, V},
    {TUI_CTX_HELP, KEY_DOWN, "Down", "scroll the help", TUI_A_DOWN, V},
    {TUI_CTX_HELP, 'j', "j", "scroll the help", TUI_A_DOWN, V},
    {TUI_CTX_HELP, KEY_UP, "Up", "scroll the help back", TUI_A_UP, V},
    {TUI_CTX_HELP, 'k', "k", "scroll the help back", TUI_A_UP, V},
    {TUI_CTX_HELP, KEY_NPAGE, "PgDn", "the next page", TUI_A_PGDN, V},
    {TUI_CTX_HELP, ' ', "Space", "the next page", TUI_A_PGDN, V},
    {TUI_CTX_HELP, KEY_PPAGE, "PgUp", "the previous page", TUI_A_PGUP, V},
    /* the quit confirmation */
    {TUI_CTX_CONFIRM, 'y', "y", "quit (the command running is stopped)", TUI_A_YES, V},
    {TUI_CTX_CONFIRM, 'n', "n", "stay", TUI_A_NO, V},
    {TUI_CTX_CONFIRM, 27, "Esc", "stay", TUI_A_NO, V},
    /* the swarm panel */
    {TUI_CTX_SWARM, 's', "s", "sort by the next column", TUI_A_SORT, V},
    {TUI_CTX_SWARM, 'S', "S", "reverse the order", TUI_A_SORT_REV, V},
    {TUI_CTX_SWARM, KEY_UP, "Up", "select the server above", TUI_A_UP, V},
    {TUI_CTX_SWARM, 'k', "k", "select the server above", TUI_A_UP, V},
    {TUI_CTX_SWARM, KEY_DOWN, "Down", "select the server below", TUI_A_DOWN, V},
    {TUI_CTX_SWARM, 'j', "j", "select the server below", TUI_A_DOWN, V},
    {TUI_CTX_SWARM, KEY_PPAGE, "PgUp", "a page up", TUI_A_PGUP, V},
    {TUI_CTX_SWARM, KEY_NPAGE, "PgDn", "a page down", TUI_A_PGDN, V},
    {TUI_CTX_SWARM, KEY_HOME, "Home", "the first server", TUI_A_HOME, V},
    {TUI_CTX_SWARM, 'g', "g", "the first server", TUI_A_HOME, V},
    {TUI_CTX_SWARM, KEY_END, "End", "the last server", TUI_A_END, V},
    {TUI_CTX_SWARM, 'G', "G", "the last server", TUI_A_END, V},
    /* the log and generation panels */
    {TUI_CTX_SCROLL, KEY_UP, "Up", "scroll up a line (stops following)", TUI_A_UP, V},
    {TUI_CTX_SCROLL, 'k', "k", "scroll up a line (stops following)", TUI_A_UP, V},
    {TUI_CTX_SCROLL, KEY_DOWN, "Down", "scroll down a line", TUI_A_DOWN, V},
    {TUI_CTX_SCROLL, 'j', "j", "scroll down a line", TUI_A_DOWN, V},
    {TUI_CTX_SCROLL, KEY_PPAGE, "PgUp", "a page up", TUI_A_PGUP, V},
    {TUI_CTX_SCROLL, KEY_NPAGE, "PgDn", "a page down", TUI_A_PGDN, V},
    {TUI_CTX_SCROLL, KEY_HOME, "Home", "the oldest line", TUI_A_HOME, V},
    {TUI_CTX_SCROLL, 'g', "g", "the oldest line", TUI_A_HOME, V},
    {TUI_CTX_SCROLL, KEY_END, "End", "the newest line, following again", TUI_A_END, V},
    {TUI_CTX_SCROLL, 'G', "G", "the newest line, following again", TUI_A_END, V},
    {TUI_CTX_SCROLL, 'f', "f", "the newest line, following again", TUI_A_END, V},
    /* the training panel */
    {TUI_CTX_TRAIN, 'l', "l", "loss on a log scale (toggle)", TUI_A_LOGY, V},
    /* everywhere */
    {TUI_CTX_GLOBAL, ':', ":", "type a command (any command of `help`)", TUI_A_CMDLINE, V},
    {TUI_CTX_GLOBAL, '?', "?", "this help", TUI_A_HELP, V},
    {TUI_CTX_GLOBAL, KEY_F(1), "F1", "this help", TUI_A_HELP, V},
    {TUI_CTX_GLOBAL, 'q', "q", "quit (asks while a command runs)", TUI_A_QUIT, V},
    {TUI_CTX_GLOBAL, KEY_F(10), "F10", "quit (asks while a command runs)", TUI_A_QUIT, V},
    {TUI_CTX_GLOBAL, TUI_KEY_SIGINT, "Ctrl-C",
     "stop the command (keeps its work), clear the queue; idle: twice quits", TUI_A_INTR, V},
    {TUI_CTX_GLOBAL, '\t', "Tab", "focus the next panel", TUI_A_FOCUS_NEXT, V},
    {TUI_CTX_GLOBAL, KEY_BTAB, "Shift-Tab", "focus the previous panel", TUI_A_FOCUS_PREV, V},
    {TUI_CTX_GLOBAL, '1', "1", "focus the swarm", TUI_A_FOCUS1, V},
    {TUI_CTX_GLOBAL, '2', "2", "focus the route", TUI_A_FOCUS2, V},
    {TUI_CTX_GLOBAL, '3', "3", "focus the generation", TUI_A_FOCUS3, V},
    {TUI_CTX_GLOBAL, '4', "4", "focus the training", TUI_A_FOCUS4, V},
    {TUI_CTX_GLOBAL, '5', "5", "focus the log", TUI_A_FOCUS5, V},
    {TUI_CTX_GLOBAL, 'z', "z", "zoom the focused panel to the whole screen (toggle)", TUI_A_ZOOM, V},
    {TUI_CTX_GLOBAL, '[', "[", "training: plot the loss / the validation metric (when one fits)", TUI_A_SERIES, V},
    {TUI_CTX_GLOBAL, ']', "]", "training: plot the loss / the validation metric (when one fits)", TUI_A_SERIES, V},
    {TUI_CTX_GLOBAL, CTRL('L'), "Ctrl-L", "repaint the screen", TUI_A_REDRAW, V},
    {TUI_CTX_GLOBAL, 'p', "p", "pause / resume drawing (events are still taken in)", TUI_A_PAUSE, V},
};
const int tui_nkeys = (int)(sizeof tui_keys / sizeof tui_keys[0]);

tui_action tui_key_action(unsigned mask, int key)
{
    for (int i = 0; i < tui_nkeys; i++)
        if ((tui_keys[i].ctx & mask) && tui_keys[i].key == key)
            return tui_keys[i].action;
    return TUI_A_NONE;
}

const char *tui_ctx_name(unsigned ctx)
{
    switch (ctx) {
    case TUI_CTX_GLOBAL: return "everywhere";
    case TUI_CTX_SWARM: return "swarm panel";
    case TUI_CTX_SCROLL: return "generation and log panels";
    case TUI_CTX_TRAIN: return "training panel";
    case TUI_CTX_CMD: return "the : line";
    case TUI_CTX_HELP: return "this help";
    case TUI_CTX_CONFIRM: return "the quit question";
    default: return "?";
    }
}

int tui_help_lines(char ***out)
{
    static const unsigned order[] = {TUI_CTX_GLOBAL, TUI_CTX_SWARM, TUI_CTX_SCROLL, TUI_CTX_TRAIN, TUI_CTX_CMD,
                                     TUI_CTX_HELP};
    int cap = tui_nkeys + 16, n = 0;
    char **lines = calloc((size_t)cap, sizeof *lines);
    if (!lines)
        return 0;
    for (size_t c = 0; c < sizeof order / sizeof order[0]; c++) {
        if (n)
            lines[n++] = strdup("");
        if (asprintf(&lines[n], "%s:", tui_ctx_name(order[c])) >= 0)
            n++;
        for (int i = 0; i < tui_nkeys; i++) {
            const tui_key *k = &tui_keys[i];
            if (k->ctx != order[c] || !(k->flags & V))
                continue;
            int seen = 0; /* an earlier visible entry of the same action and help took this line */
            for (int j = 0; j < i && !seen; j++)
                seen = tui_keys[j].ctx == k->ctx && tui_keys[j].action == k->action && (tui_keys[j].flags & V) &&
                       !strcmp(tui_keys[j].help, k->help);
            if (seen)
                continue;
            char names[64] = "";
            size_t len = 0;
            for (int j = i; j < tui_nkeys; j++) /* every key of this line */
                if (tui_keys[j].ctx == k->ctx && tui_keys[j].action == k->action && (tui_keys[j].flags & V) &&
                    !strcmp(tui_keys[j].help, k->help) && len < sizeof names)
                    len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? " " : "", tui_keys[j].name);
            if (n < cap && asprintf(&lines[n], "  %-14s %s", names, k->help) >= 0)
                n++;
        }
    }
    *out = lines;
    return n;
}

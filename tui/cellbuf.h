/* cellbuf.h - the plain grid every TUI widget draws into: cells of one code point, a semantic role (what it
 * means, not its colour) and a few attributes. Nothing here knows about curses: the frame copies a grid to the
 * screen (crt.c), and the tests compare rows as strings. A grid is in UTF-8 mode or ASCII mode; in ASCII mode
 * text outside ASCII becomes '?' and the widgets draw with the ASCII glyph set, so a non-UTF-8 terminal never
 * gets a byte it cannot show. */
#ifndef SEPAL_TUI_CELLBUF_H
#define SEPAL_TUI_CELLBUF_H

#include <stddef.h>
#include <stdint.h>

/* Roles: each colour scheme (crt.c) maps them to colours and attributes; the monochrome one to attributes. */
typedef enum tui_role {
    R_TEXT, R_DIM, R_TITLE, R_TITLE_FOCUS, R_BORDER, R_HEADER, R_SEL, R_GOOD, R_WARN, R_ERR,
    R_ONLINE, R_JOINING, R_UNREACH, R_OFFLINE, R_PLOT, R_PLOT2, R_AXIS, R_BAR, R_BAR_EMPTY,
    R_PROMPT, R_GEN_PROMPT, R_KEY, R_STATUS, R_TOAST, R_NROLES
} tui_role;

/* Attributes on top of the role's. */
enum { TUI_BOLD = 1, TUI_REV = 2, TUI_UNDER = 4 };

typedef struct tui_cell {
    uint32_t ch; /* a code point; 0: the right half of the wide character to its left */
    uint8_t role, flags;
} tui_cell;

typedef struct tui_cb {
    int w, h;
    int utf8;   /* UTF-8 glyphs and text, else ASCII only */
    tui_cell *c;
} tui_cb;

/* The glyphs widgets draw with: one set for UTF-8 terminals, one for ASCII. */
typedef struct tui_glyphs {
    uint32_t h, v, tl, tr, bl, br, ltee, rtee, ttee, btee; /* box drawing */
    uint32_t state[4];      /* server states: online, joining, unreachable, offline */
    uint32_t full, empty;   /* span bars and progress bars */
    uint32_t left_part, right_part; /* a cell partly in a span: its left / right part */
    uint32_t eighth[8];     /* progress bar: 0..7 eighths of a cell (eighth[0] unused) */
    uint32_t spark[8];      /* sparkline levels */
    uint32_t arrow, up, down, ellipsis, check, cross, more;
    int braille;            /* plots in braille (2x4 dots a cell), else ASCII (1x2) */
} tui_glyphs;

enum { TUI_ST_ONLINE, TUI_ST_JOINING, TUI_ST_UNREACH, TUI_ST_OFFLINE };

const tui_glyphs *tui_glyphs_for(int utf8);
static inline const tui_glyphs *tui_cb_glyphs(const tui_cb *cb) { return tui_glyphs_for(cb->utf8); }

/* A grid of h x w blank cells (0, or -1 out of memory: the grid is then empty). */
int tui_cb_resize(tui_cb *cb, int h, int w);
void tui_cb_free(tui_cb *cb);
void tui_cb_clear(tui_cb *cb);
/* One cell (clipped to the grid). */
void tui_cb_put(tui_cb *cb, int y, int x, uint32_t ch, int role, int flags);
/* A rectangle of one character. */
void tui_cb_fill(tui_cb *cb, int y, int x, int h, int w, uint32_t ch, int role, int flags);
/* Sets the role / adds flags of a rectangle without changing its characters. */
void tui_cb_paint(tui_cb *cb, int y, int x, int h, int w, int role, int flags);
/* UTF-8 text from column x, at most maxw columns (clipped to the grid); wide characters take two, control and
 * zero-width ones are dropped, invalid bytes become U+FFFD ('?' in ASCII mode). Returns the columns used. */
int tui_cb_text(tui_cb *cb, int y, int x, int maxw, const char *s, int role, int flags);
int tui_cb_textn(tui_cb *cb, int y, int x, int maxw, const char *s, size_t len, int role, int flags);
int tui_cb_printf(tui_cb *cb, int y, int x, int maxw, int role, int flags, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* Right-aligned so that it ends at column xend (exclusive); returns the column it starts at. */
int tui_cb_text_right(tui_cb *cb, int y, int xend, int maxw, const char *s, int role, int flags);
/* Copies src into cb at (y, x), clipped. */
void tui_cb_blit(tui_cb *cb, int y, int x, const tui_cb *src);
/* Row y as UTF-8 (trailing blanks kept), for tests and text screenshots. */
void tui_cb_row(const tui_cb *cb, int y, char *out, size_t cap);

/* UTF-8 helpers. Decodes one code point from s[0..n) into *cp (U+FFFD for an invalid sequence); returns the
 * bytes used (>= 1 when n >= 1). */
int tui_utf8_decode(const char *s, size_t n, uint32_t *cp);
/* Encodes cp; returns the bytes written (1-4) into out[4]. */
int tui_utf8_encode(uint32_t cp, char *out);
/* Columns of a code point as the terminal counts them (the locale's wcwidth): 0 for control and combining
 * characters, 1 or 2; -1 for one the locale cannot show. */
int tui_cpwidth(uint32_t cp);
/* Columns of a UTF-8 string. */
int tui_strwidth(const char *s);

#endif

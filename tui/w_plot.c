/* w_plot.c - a line plot on a braille canvas (2 x 4 dots a cell; ASCII: 1 x 2 as ' . : ) with nice, auto-scaled
 * ticks on a left gutter and step labels under the x axis. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "widgets.h"

void tui_tick_label(double v, char *buf, size_t cap)
{
    if (fabs(v) < 1e-12)
        v = 0;
    char t[32];
    if (v != 0 && (fabs(v) < 1e-3 || fabs(v) >= 1e5)) { /* 1e-4, 2.5e6: a mantissa without trailing zeros */
        snprintf(t, sizeof t, "%.2e", v);
        char *e = strchr(t, 'e'), *z = e;
        while (z > t && z[-1] == '0')
            z--;
        if (z > t && z[-1] == '.')
            z--;
        memmove(z, e, strlen(e) + 1);
    } else {
        snprintf(t, sizeof t, "%.3g", v);
    }
    char *e = strchr(t, 'e');
    if (e) { /* 1e-04 -> 1e-4, 2.5e+03 -> 2.5e3 */
        char *d = e + 1, *s = d;
        int neg = *s == '-';
        if (*s == '-' || *s == '+')
            s++;
        while (*s == '0' && s[1])
            s++;
        if (neg)
            *d++ = '-';
        memmove(d, s, strlen(s) + 1);
    }
    snprintf(buf, cap, "%s", t);
}

int tui_nice_ticks(double lo, double hi, int max_ticks, tui_axis *ax)
{
    memset(ax, 0, sizeof *ax);
    if (!isfinite(lo) || !isfinite(hi)) {
        lo = 0;
        hi = 1;
    }
    if (hi < lo) {
        double t = lo;
        lo = hi;
        hi = t;
    }
    if (hi - lo <= fabs(hi) * 1e-12 || hi == lo) { /* one value: a range around it */
        double d = lo != 0 ? fabs(lo) * 0.1 : 1;
        lo -= d;
        hi += d;
    }
    if (max_ticks < 2)
        max_ticks = 2;
    if (max_ticks > TUI_MAX_TICKS)
        max_ticks = TUI_MAX_TICKS;
    double raw = (hi - lo) / (max_ticks - 1), mag = pow(10, floor(log10(raw)));
    static const double M[] = {1, 2, 2.5, 5, 10, 20};
    double step = 0;
    long k0 = 0, k1 = 0;
    for (int i = 0; i < 6; i++) {
        step = M[i] * mag;
        k0 = (long)floor(lo / step + 1e-9);
        k1 = (long)ceil(hi / step - 1e-9);
        if (k1 - k0 + 1 <= max_ticks)
            break;
    }
    if (k1 <= k0)
        k1 = k0 + 1;
    ax->step = step;
    ax->lo = (double)k0 * step;
    ax->hi = (double)k1 * step;
    ax->n = (int)(k1 - k0 + 1);
    if (ax->n > TUI_MAX_TICKS)
        ax->n = TUI_MAX_TICKS;
    for (int i = 0; i < ax->n; i++)
        ax->tick[i] = (double)(k0 + i) * step;
    return ax->n;
}

/* 1-2-5 sequence: j -> {1, 2, 5}[j mod 3] x 10^(j div 3) */
static double seq125(long j)
{
    static const double m[3] = {1, 2, 5};
    long d = j >= 0 ? j / 3 : -((-j + 2) / 3);
    return m[j - d * 3] * pow(10, (double)d);
}

int tui_log_ticks(double lo, double hi, int max_ticks, tui_axis *ax)
{
    memset(ax, 0, sizeof *ax);
    ax->log = 1;
    if (!(lo > 0) || !isfinite(lo))
        lo = 1e-3;
    if (!(hi > 0) || !isfinite(hi))
        hi = lo * 10;
    if (hi < lo) {
        double t = lo;
        lo = hi;
        hi = t;
    }
    if (max_ticks < 2)
        max_ticks = 2;
    if (max_ticks > TUI_MAX_TICKS)
        max_ticks = TUI_MAX_TICKS;
    long j0 = (long)floor(log10(lo)) * 3, j1;
    while (seq125(j0 + 1) <= lo * (1 + 1e-9))
        j0++;
    for (j1 = j0 + 1; seq125(j1) < hi * (1 - 1e-9); j1++)
        ;
    if (j1 - j0 + 1 <= max_ticks) { /* 1, 2, 5 per decade */
        ax->n = (int)(j1 - j0 + 1);
        for (int i = 0; i < ax->n; i++)
            ax->tick[i] = seq125(j0 + i);
    } else { /* every s decades */
        long d0 = (long)floor(log10(lo) + 1e-9), d1 = (long)ceil(log10(hi) - 1e-9);
        if (d1 <= d0)
            d1 = d0 + 1;
        long s = (d1 - d0 + max_ticks - 2) / (max_ticks - 1);
        if (s < 1)
            s = 1;
        long k = (d1 - d0 + s - 1) / s;
        ax->n = (int)(k + 1);
        ax->step = (double)s;
        for (int i = 0; i < ax->n; i++)
            ax->tick[i] = pow(10, (double)(d0 + i * s));
    }
    ax->lo = ax->tick[0];
    ax->hi = ax->tick[ax->n - 1];
    return ax->n;
}

/* The y range to show: the data's (padded), through the hysteresis of scale. */
static void y_range(const double *ys, int n, const tui_plot_opts *o, tui_plot_scale *scale, double *lo, double *hi)
{
    double dlo = INFINITY, dhi = -INFINITY;
    for (int i = 0; i < n; i++)
        if (isfinite(ys[i]) && (!o->logy || ys[i] > 0)) {
            dlo = ys[i] < dlo ? ys[i] : dlo;
            dhi = ys[i] > dhi ? ys[i] : dhi;
        }
    if (o->fixed) {
        *lo = o->fixed_lo;
        *hi = o->fixed_hi;
        return;
    }
    if (!(dhi >= dlo)) {
        *lo = o->logy ? 0.1 : 0;
        *hi = 1;
        return;
    }
    if (o->logy) {
        dlo /= 1.05;
        dhi *= 1.05;
    } else {
        double pad = (dhi - dlo) * 0.05;
        int nonneg = dlo >= 0; /* a loss: the padding does not take the axis below 0 */
        dlo -= pad;
        dhi += pad;
        if (nonneg && dlo < 0)
            dlo = 0;
    }
    if (!scale) {
        *lo = dlo;
        *hi = dhi;
        return;
    }
    double span = o->logy ? log10(scale->hi / scale->lo) : scale->hi - scale->lo;
    double dspan = o->logy ? log10(dhi / dlo) : dhi - dlo;
    if (!scale->valid || dlo < scale->lo || dhi > scale->hi || (o->logy && scale->lo <= 0)) {
        scale->lo = dlo;
        scale->hi = dhi;
        scale->shrink = 0;
        scale->valid = 1;
    } else if (dspan < 0.5 * span) {
        if (++scale->shrink >= 5) {
            scale->lo = dlo;
            scale->hi = dhi;
            scale->shrink = 0;
        }
    } else {
        scale->shrink = 0;
    }
    *lo = scale->lo;
    *hi = scale->hi;
}

static const uint8_t BRAILLE_BIT[4][2] = {{0x01, 0x08}, {0x02, 0x10}, {0x04, 0x20}, {0x40, 0x80}};

typedef struct canvas {
    int cw, ch;       /* cells */
    int dx, dy;       /* dots per cell */
    uint8_t *bits;    /* per cell */
} canvas;

static void dot(canvas *c, int px, int py)
{
    if (px < 0 || py < 0 || px >= c->cw * c->dx || py >= c->ch * c->dy)
        return;
    int cx = px / c->dx, cy = py / c->dy, bx = px % c->dx, by = py % c->dy;
    uint8_t bit = c->dx == 2 ? BRAILLE_BIT[by][bx] : (uint8_t)(by ? 2 : 1);
    c->bits[cy * c->cw + cx] |= bit;
}

/* A vertical run of dots at column px between rows a and b. */
static void vrun(canvas *c, int px, int a, int b)
{
    if (a > b) {
        int t = a;
        a = b;
        b = t;
    }
    for (int r = a; r <= b; r++)
        dot(c, px, r);
}

/* The polyline through the points: each segment as vertical runs per dot column. */
static void polyline(canvas *c, const double *xs, const double *ys, int n, double x0, double x1, double lo, double hi,
                     int logy)
{
    int DW = c->cw * c->dx, DH = c->ch * c->dy, have = 0;
    double ylo = logy ? log10(lo) : lo, yhi = logy ? log10(hi) : hi;
    int pcx = 0, pcy = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(ys[i]) || (logy && ys[i] <= 0))
            continue;
        double yv = logy ? log10(ys[i]) : ys[i];
        int cx = (int)lround((xs[i] - x0) / (x1 - x0) * (DW - 1));
        int cy = (int)lround((yhi - yv) / (yhi - ylo) * (DH - 1));
        cy = cy < 0 ? 0 : cy >= DH ? DH - 1 : cy;
        if (!have) {
            dot(c, cx, cy);
        } else if (cx == pcx) {
            vrun(c, cx, pcy, cy);
        } else { /* columns pcx+1 .. cx, each joined to the previous column's row */
            int prev = pcy;
            for (int k = pcx + 1; k <= cx; k++) {
                int r = (int)lround(pcy + (double)(cy - pcy) * (k - pcx) / (cx - pcx));
                vrun(c, k, k == pcx + 1 ? prev : prev + (r > prev ? 1 : r < prev ? -1 : 0), r);
                prev = r;
            }
        }
        have = 1;
        pcx = cx;
        pcy = cy;
    }
}

/* The y value at dot row r of DH (top 0). */
static int row_of(double v, double lo, double hi, int logy, int rows)
{
    double a = logy ? log10(lo) : lo, b = logy ? log10(hi) : hi, t = logy ? log10(v) : v;
    int r = (int)lround((b - t) / (b - a) * (rows - 1));
    return r < 0 ? 0 : r >= rows ? rows - 1 : r;
}

static void x_labels(tui_cb *cb, int y, int px, int pw, double x0, double x1, int n, const char *unit)
{
    char a[32], b[32];
    if (!n)
        return;
    snprintf(a, sizeof a, "%.6g", x0);
    snprintf(b, sizeof b, "%.6g", x1);
    int la = tui_cb_text(cb, y, px, pw, a, R_AXIS, 0);
    int lb = (int)strlen(b);
    if (x1 != x0 && la + 1 + lb <= pw)
        tui_cb_text_right(cb, y, px + pw, lb, b, R_AXIS, 0);
    int lu = unit ? tui_strwidth(unit) : 0;
    int ux = px + (pw - lu) / 2;
    if (unit && ux > px + la && ux + lu < px + pw - lb)
        tui_cb_text(cb, y, ux, lu, unit, R_DIM, 0);
}

void tui_plot(tui_cb *cb, int y, int x, int h, int w, const double *xs, const double *ys, int n,
              const tui_plot_opts *o, tui_plot_scale *scale)
{
    tui_plot_line one = {.xs = xs, .ys = ys, .n = n, .role = o ? o->role : R_PLOT};
    tui_plot_lines(cb, y, x, h, w, &one, 1, o, scale);
}

/* Every line's y values in one array (*own: to free), for the range. */
static const double *all_ys(const tui_plot_line *lines, int nl, int *n, double **own)
{
    *own = NULL;
    *n = 0;
    for (int i = 0; i < nl; i++)
        *n += lines[i].n;
    if (nl == 1)
        return lines[0].ys;
    double *ys = *n ? malloc((size_t)*n * sizeof *ys) : NULL;
    for (int i = 0, k = 0; ys && i < nl; k += lines[i].n, i++)
        memcpy(ys + k, lines[i].ys, (size_t)lines[i].n * sizeof *ys);
    *own = ys;
    if (!ys)
        *n = 0;
    return ys;
}

void tui_plot_lines(tui_cb *cb, int y, int x, int h, int w, const tui_plot_line *lines, int nl,
                    const tui_plot_opts *o, tui_plot_scale *scale)
{
    const tui_glyphs *g = tui_cb_glyphs(cb);
    static const tui_plot_opts def = {.role = R_PLOT};
    if (!o)
        o = &def;
    if (h < 2 || w < 8)
        return;
    int sep_labels = h >= 6, ph = h - 1 - sep_labels, n;
    double lo, hi, *own;
    const double *ys = all_ys(lines, nl, &n, &own);
    y_range(ys, n, o, scale, &lo, &hi);
    free(own);
    tui_axis ax;
    int max_ticks = ph / 2 + 2 > 5 ? 5 : ph / 2 + 2; /* a label every other row at most */
    if (o->logy)
        tui_log_ticks(lo, hi, max_ticks, &ax);
    else
        tui_nice_ticks(lo, hi, max_ticks, &ax);
    if (!o->fixed || o->logy) {
        lo = ax.lo;
        hi = ax.hi;
    }
    char lab[TUI_MAX_TICKS][16];
    int gw = 1;
    for (int i = 0; i < ax.n; i++) {
        tui_tick_label(ax.tick[i], lab[i], sizeof lab[i]);
        int lw = (int)strlen(lab[i]);
        gw = lw > gw ? lw : gw;
    }
    if (gw > 7)
        gw = 7;
    if (gw > w / 3)
        gw = w / 3;
    int px = x + gw + 1, pw = w - gw - 1;
    /* axes */
    for (int r = 0; r < ph; r++)
        tui_cb_put(cb, y + r, x + gw, g->v, R_AXIS, 0);
    tui_cb_put(cb, y + ph, x + gw, g->bl, R_AXIS, 0);
    tui_cb_fill(cb, y + ph, px, 1, pw, g->h, R_AXIS, 0);
    /* y labels, one per row at most */
    int used[256] = {0};
    for (int i = 0; n && i < ax.n; i++) {
        if (ax.tick[i] < lo - 1e-12 * fabs(lo) || ax.tick[i] > hi + 1e-12 * fabs(hi))
            continue;
        int r = row_of(ax.tick[i], lo, hi, o->logy, ph);
        if (r < 256 && !used[r]) {
            used[r] = 1;
            tui_cb_text_right(cb, y + r, x + gw, gw, lab[i], R_AXIS, 0);
        }
    }
    /* the curves: the steps of all of them */
    double x0 = INFINITY, x1 = -INFINITY;
    for (int i = 0; i < nl; i++)
        if (lines[i].n) {
            x0 = fmin(x0, lines[i].xs[0]);
            x1 = fmax(x1, lines[i].xs[lines[i].n - 1]);
        }
    if (!n)
        x0 = 0, x1 = 1;
    if (!(x1 > x0))
        x1 = x0 + 1;
    canvas c = {.cw = pw, .ch = ph, .dx = g->braille ? 2 : 1, .dy = g->braille ? 4 : 2};
    c.bits = calloc((size_t)pw * (size_t)ph, 1);
    for (int i = 0; c.bits && i < nl; i++) {
        memset(c.bits, 0, (size_t)pw * (size_t)ph);
        polyline(&c, lines[i].xs, lines[i].ys, lines[i].n, x0, x1, lo, hi, o->logy);
        for (int r = 0; r < ph; r++)
            for (int k = 0; k < pw; k++) {
                uint8_t b = c.bits[r * pw + k];
                if (!b)
                    continue;
                uint32_t ch = g->braille ? 0x2800u + b : b == 3 ? ':' : b == 1 ? '\'' : '.';
                tui_cb_put(cb, y + r, px + k, ch, lines[i].role, 0);
            }
    }
    free(c.bits);
    x_labels(cb, y + ph + sep_labels, px, pw, x0, x1, n, o->xunit);
}

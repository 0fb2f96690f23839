/* kmath_moe.h - the arithmetic of the device's mixture of experts (moe.cu), as kmath.h's functions are: compiled by
 * nvcc __host__ __device__, by a C compiler plain static inline C, so that tests/test_cuda_host.c checks them here
 * against core/'s sp_moe_route_forward / _backward and block.c's grouping, without a GPU.
 *
 * The specification is core/: a token's router logits pick its top-k experts (the largest first, a tie to the lower
 * index), each weighted by its softmax probability over all E logits (max subtracted, the exponentials summed in
 * expert order), the k weights renormalised to sum 1; the (token, k) pairs ("pairs", i = n K + k) are grouped by
 * expert into "slots" (expert 0's pairs first, each expert's in pair order), and a token's outputs are summed in
 * expert order. */
#ifndef SEPAL_CUDA_KMATH_MOE_H
#define SEPAL_CUDA_KMATH_MOE_H

#include "kmath.h"

/* Token routing (sp_moe_route_forward for one token): w[nk] and idx[nk] from logits[ne], in core's order of
 * operations. */
SP_HD void sp_km_moe_route(float *w, int32_t *idx, const float *logits, int ne, int nk)
{
    float mx = logits[0], sum = 0.0f;
    for (int e = 1; e < ne; e++)
        mx = logits[e] > mx ? logits[e] : mx;
    for (int e = 0; e < ne; e++)
        sum += expf(logits[e] - mx);
    for (int k = 0; k < nk; k++) {
        int best = -1;
        for (int e = 0; e < ne; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++)
                taken |= idx[j] == e;
            if (!taken && (best < 0 || logits[e] > logits[best]))
                best = e;
        }
        idx[k] = best;
        w[k] = expf(logits[best] - mx) / sum;
    }
    float tot = 0.0f;
    for (int k = 0; k < nk; k++)
        tot += w[k];
    for (int k = 0; k < nk; k++)
        w[k] /= tot;
}

/* The routing's backward for one token (sp_moe_route_backward): dlogits[ne] WRITTEN (zeros but at the chosen experts)
 * from the gradient dw[nk] of its weights w[nk]. */
SP_HD void sp_km_moe_route_bwd(float *dlogits, const float *dw, const float *w, const int32_t *idx, int ne, int nk)
{
    float dot = 0.0f;
    for (int k = 0; k < nk; k++)
        dot += w[k] * dw[k];
    for (int e = 0; e < ne; e++)
        dlogits[e] = 0.0f;
    for (int k = 0; k < nk; k++)
        dlogits[idx[k]] += w[k] * (dw[k] - dot);
}

/* The slot of pair i among the NK pairs' experts ridx: the pairs of lower experts, and those of its own before it. */
SP_HD int sp_km_moe_slot(const int32_t *ridx, int NK, int i)
{
    int e = ridx[i], s = 0;
    for (int j = 0; j < NK; j++)
        s += ridx[j] < e || (ridx[j] == e && j < i);
    return s;
}

/* The first slot of expert e (e = ne: NK): the pairs of lower experts. */
SP_HD int sp_km_moe_first(const int32_t *ridx, int NK, int e)
{
    int s = 0;
    for (int j = 0; j < NK; j++)
        s += ridx[j] < e;
    return s;
}

/* The g-th of the experts that have pairs, in expert order (-1 when fewer than g + 1 have): the decode step's
 * experts (moe.cu's used[g], each of whose matrices a block row of a product streams). */
SP_HD int sp_km_moe_used(const int32_t *ridx, int NK, int ne, int g)
{
    for (int e = 0; e < ne; e++) {
        int has = 0;
        for (int j = 0; j < NK; j++)
            has |= ridx[j] == e;
        if (has && g-- == 0)
            return e;
    }
    return -1;
}

/* Which of a token's nk choices idx[nk] (distinct experts) comes next in expert order after expert `after` (-1: the
 * first): the k of the smallest expert above it. */
SP_HD int sp_km_moe_next(const int32_t *idx, int nk, int after)
{
    int best = -1;
    for (int k = 0; k < nk; k++)
        if (idx[k] > after && (best < 0 || idx[k] < idx[best]))
            best = k;
    return best;
}

#endif

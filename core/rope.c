#include "rope.h"

#include <math.h>

/* llama3 scaling (Llama 3.1): long wavelengths are divided by `factor`, short ones kept, and the band
 * between low_freq_wavelen and high_freq_wavelen interpolated smoothly. */
static float llama3_scale(float inv_freq, const sp_config *c)
{
    double old_ctx = c->rope_orig_max_pos, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
    double low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
    double wavelen = 2.0 * M_PI / inv_freq;
    if (wavelen < high_wavelen)
        return inv_freq;
    if (wavelen > low_wavelen)
        return (float)(inv_freq / c->rope_factor);
    double smooth = (old_ctx / wavelen - lo) / (hi - lo);
    return (float)((1.0 - smooth) * inv_freq / c->rope_factor + smooth * inv_freq);
}

sp_status sp_rope_init(sp_rope *r, const sp_config *cfg, sp_err *err)
{
    int hd = cfg->head_dim;
    if (hd <= 0 || hd % 2 || hd / 2 > SP_ROPE_MAX_HALF)
        return sp_errf(err, SP_ERR_UNSUPPORTED, "rope: head_dim %d not supported", hd);
    r->hd = hd;
    float base = (float)cfg->rope_theta;
    for (int i = 0; i < hd / 2; i++) {
        float f = 1.0f / powf(base, (float)(2 * i) / (float)hd);
        if (cfg->rope_type == SP_ROPE_LINEAR)
            f = (float)(f / cfg->rope_factor);
        else if (cfg->rope_type == SP_ROPE_LLAMA3)
            f = llama3_scale(f, cfg);
        r->inv_freq[i] = f;
    }
    return SP_OK;
}

void sp_rope_tables(const sp_rope *r, int pos0, int T, float *cos, float *sin)
{
    int half = r->hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)(pos0 + t) * r->inv_freq[i];
            cos[(long)t * half + i] = cosf(a);
            sin[(long)t * half + i] = sinf(a);
        }
}

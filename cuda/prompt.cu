// prompt.cu - deep prompts added to hidden states on the device (a server's span, server/span_cuda.c): the
// device twin of the server's add_prompt (rpc.c).
#include "kernels.h"

#include "launch.cuh"

namespace {

__global__ void add_prompt_kernel(float *h, const float *prompt, int B, int T, int t0, int P, int H, int rows)
{
    long n = (long)B * rows * H;
    SPK_GRID_LOOP(i, n)
    {
        int c = (int)(i % H), t = (int)(i / H % rows), b = (int)(i / H / rows);
        h[((long)b * T + t) * H + c] += prompt[((long)b * P + t0 + t) * H + c];
    }
}

} // namespace

extern "C" sp_status sp_cuda_add_prompt(sp_cuda *cu, float *h, const float *prompt, int B, int T, int t0, int P,
                                        int H, sp_err *err)
{
    if (B < 0 || T < 0 || H <= 0 || t0 < 0 || P < 0)
        return sp_errf(err, SP_ERR_ARG, "add prompt: bad shape");
    int rows = P - t0 < T ? P - t0 : T;
    if (rows <= 0 || B == 0)
        return SP_OK;
    long n = (long)B * rows * H;
    add_prompt_kernel<<<spk::grid_for(n), spk::kThreads, 0, spk::stream_of(cu)>>>(h, prompt, B, T, t0, P, H, rows);
    return spk::launched(err, "add prompt");
}

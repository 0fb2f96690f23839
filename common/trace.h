/* trace.h - timestamps at the hand-offs of a decode step, to find where a swarm token's time goes (issue 26). Built
 * only with -DSEPAL_HOP_TRACE=ON (bench/hop-trace.sh builds and reads it); otherwise SP_TRACE(tag) is nothing.
 * Each process keeps up to 200,000 (tag, CLOCK_MONOTONIC ns) pairs and writes them all, one "tag ns" line each, to
 * $SEPAL_TRACE_DIR/trace-PID.txt every 4096 records, at SP_TRACE_FLUSH() and at exit (nothing without
 * SEPAL_TRACE_DIR). The clock is the machine's, so the client's and the servers' records line up. */
#ifndef SEPAL_TRACE_H
#define SEPAL_TRACE_H

enum {
    SP_TR_STEP = 1,          /* client: a swarm step begins (embedding next) */
    SP_TR_SEND = 2,          /* client: a hop's INFERENCE_STEP is about to be sent */
    SP_TR_REPLY = 3,         /* client: its reply is decoded */
    SP_TR_HEAD_DONE = 4,     /* client: the step's head is done */
    SP_TR_HOPS = 5,          /* client: the hops begin */
    SP_TR_HOPS_DONE = 6,     /* client: the hops are done */
    SP_TR_WRITTEN = 7,       /* client (sp_remote): a request is written to the socket */
    SP_TR_READ = 8,          /* client (sp_remote): a reply is read whole, not yet decoded */
    SP_TR_SRV_WOKE = 10,     /* server: the bulk thread's poll returned with a socket to read */
    SP_TR_SRV_MSG = 11,      /* server: a message arrived (on_message) */
    SP_TR_SRV_COMPUTE = 12,  /* server: a step's (or a pass's) blocks begin */
    SP_TR_SRV_COMPUTED = 13, /* server: ... and are done */
    SP_TR_SRV_SEND = 14,     /* server: a reply is handed to the transport */
    SP_TR_SRV_SENT = 15,     /* server: ... and the transport returned */
    SP_TR_SRV_WORKER = 16,   /* server: a worker took a task from the queue */
    SP_TR_SRV_INLINE = 17,   /* server: a step runs on the transport thread */
    SP_TR_SRV_PUSH = 18,     /* server: a step's output is pushed to the next server */
    SP_TR_SRV_PUSHED = 19,   /* server: ... and the next server acknowledged it */
    SP_TR_ONE = 21,          /* one process (sp_model_forward_argmax): begins */
    SP_TR_ONE_BLOCKS = 22,   /* ... its blocks are done */
    SP_TR_ONE_HEAD = 23,     /* ... its head is done */
    SP_TR_BLOCK = 30,        /* a block's decode step begins (sp_block_forward, sp_block_step_batch) */
    SP_TR_BLOCK_DONE = 31,   /* ... and ends */
    SP_TR_POOL_WAKE = 32,    /* a pool's job wakes workers that slept */
    SP_TR_POOL_CONTENDED = 33, /* a pool found the machine contended (nobody spins for a while) */
};

#ifdef SEPAL_HOP_TRACE
void sp_trace(int tag);
void sp_trace_flush(void);
#define SP_TRACE(tag) sp_trace(tag)
#define SP_TRACE_FLUSH() sp_trace_flush()
#else
#define SP_TRACE(tag) ((void)0)
#define SP_TRACE_FLUSH() ((void)0)
#endif

#endif

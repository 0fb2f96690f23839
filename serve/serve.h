/* serve.h - the HTTP front end: the OpenAI-compatible endpoint that the `serve` command runs (cmd/cmd_serve.c
 * hands over through app->serve). A front end of the command layer beside repl/ and tui/: it uses the app's
 * runtime (the session's model and swarm) and its sink (each request's line in the log), never another front
 * end, and never a runtime of its own. */
#ifndef SEPAL_SERVE_H
#define SEPAL_SERVE_H

#include "app.h"

/* Serves until the app is cancelled (Ctrl-C): 0, or 1 after an error message (the address cannot be listened
 * on). Requests in progress when it stops end with an error (an error event for a stream). */
int sp_serve_run(sp_app *app, const sp_serve_opts *o);

#endif

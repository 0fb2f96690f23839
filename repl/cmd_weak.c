/* cmd_weak.c - empty command groups, overridden by the real tables (cmd_swarm.c, cmd_generate.c) when they
 * are linked in: the program links and runs with or without them. */
#include "cmd.h"

__attribute__((weak)) const sp_cmd sp_cmds_swarm[] = {{0}};
__attribute__((weak)) const sp_cmd sp_cmds_generate[] = {{0}};

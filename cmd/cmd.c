/* cmd.c - the command table: the groups in the order `help` lists them, and lookup by name, alias or unique
 * prefix (subcommands too). Parsing: parse.c; running lines and scripts: script.c; help: help.c; Tab
 * completion: complete.c. Nothing here prints: output goes through the app's sink. */
#include "cmd.h"

#include <stdio.h>
#include <string.h>

const sp_cmd_group sp_cmd_groups[] = {
    {"core", sp_cmds_core},
    {"model", sp_cmds_model},
    {"swarm", sp_cmds_swarm},
    {"generate", sp_cmds_generate},
    {"train", sp_cmds_train},
    {NULL, NULL},
};

/* ---------------------------------------------------------------------------------------------- */
/* lookup */

/* 1 if name is one of the comma-separated aliases. */
static int alias_match(const char *aliases, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = aliases; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, name, n))
            return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

const sp_cmd *sp_cmd_find_in(const sp_cmd *table, const char *name, char *why, size_t cap)
{
    SP_CMD_EACH(table, c)
    if (!strcmp(c->name, name) || alias_match(c->aliases, name))
        return c;
    size_t n = strlen(name);
    const sp_cmd *hit = NULL;
    int count = 0;
    SP_CMD_EACH(table, c)
    if (n && !strncmp(c->name, name, n)) {
        hit = c;
        count++;
    }
    if (count == 1)
        return hit;
    if (!why || !cap)
        return NULL;
    const char *what = table ? "subcommand" : "command";
    if (!count) {
        size_t len = (size_t)snprintf(why, cap, "unknown %s '%s'", what, name);
        if (table) {
            len += (size_t)snprintf(why + len, len < cap ? cap - len : 0, " (one of: ");
            int first = 1;
            SP_CMD_EACH(table, c)
            {
                sp_opt_list_add(why, cap, &len, c->name, first);
                first = 0;
            }
            if (len < cap)
                snprintf(why + len, cap - len, ")");
        } else if (len < cap) {
            snprintf(why + len, cap - len, " (try 'help')");
        }
        return NULL;
    }
    size_t len = (size_t)snprintf(why, cap, "ambiguous %s '%s': ", what, name);
    len = len < cap ? len : cap - 1;
    int first = 1;
    SP_CMD_EACH(table, c)
    if (!strncmp(c->name, name, n)) {
        sp_opt_list_add(why, cap, &len, c->name, first);
        first = 0;
    }
    return NULL;
}

const sp_cmd *sp_cmd_find(const char *name, char *why, size_t cap) { return sp_cmd_find_in(NULL, name, why, cap); }

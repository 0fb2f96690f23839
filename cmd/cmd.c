/* cmd.c - the command table: the groups in the order `help` lists them, and lookup by name, alias or unique
 * prefix (subcommands too; an unknown name gets the nearest names, as git suggests them). Parsing: parse.c;
 * running lines and scripts: script.c; help: help.c; Tab completion: complete.c. Nothing here prints: output
 * goes through the app's sink. */
#include "cmd.h"

#include <stdio.h>
#include <string.h>

const sp_cmd_group sp_cmd_groups[] = {
    {"core", sp_cmds_core},
    {"model", sp_cmds_model},
    {"swarm", sp_cmds_swarm},
    {"generate", sp_cmds_generate},
    {"train", sp_cmds_train},
    {"serve", sp_cmds_serve},
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

/* The command of table (NULL: the top level) that name names exactly or as an alias, else the only one whose name
 * starts with it; *count: how many start with it. */
static const sp_cmd *match(const sp_cmd *table, const char *name, int *count)
{
    SP_CMD_EACH(table, c)
    if (!strcmp(c->name, name) || alias_match(c->aliases, name))
        return c;
    size_t n = strlen(name);
    const sp_cmd *hit = NULL;
    *count = 0;
    SP_CMD_EACH(table, c)
    if (n && !strncmp(c->name, name, n))
        hit = c, (*count)++;
    return *count == 1 ? hit : NULL;
}

/* Appends the names of table's commands that start with prefix ("": all), ", " between them. */
static void list_names(const sp_cmd *table, const char *prefix, char *why, size_t cap, size_t *len)
{
    int first = 1;
    SP_CMD_EACH(table, c)
    if (!strncmp(c->name, prefix, strlen(prefix))) {
        sp_opt_list_add(why, cap, len, c->name, first);
        first = 0;
    }
}

/* Offers the names and aliases of table's commands to s. */
static void similar_names(const sp_cmd *table, sp_similar *s)
{
    SP_CMD_EACH(table, c)
    {
        sp_similar_offer(s, c->name, strlen(c->name));
        for (const char *p = c->aliases; p && *p;) {
            size_t len = strcspn(p, ",");
            sp_similar_offer(s, p, len);
            p += len + (p[len] == ',');
        }
    }
}

const sp_cmd *sp_cmd_find_in(const sp_cmd *table, const char *name, char *why, size_t cap)
{
    int count = 0;
    const sp_cmd *c = match(table, name, &count);
    if (c || !why || !cap)
        return c;
    const char *what = table ? "subcommand" : "command";
    size_t len = (size_t)snprintf(why, cap, count ? "ambiguous %s '%s': " : "unknown %s '%s'", what, name);
    len = len < cap ? len : cap - 1;
    sp_similar near;
    sp_similar_init(&near, name);
    similar_names(table, &near);
    if (count) {
        list_names(table, name, why, cap, &len);
    } else if (near.n) {
        sp_similar_say(&near, NULL, why, cap, &len);
    } else if (table) {
        sp_opt_list_add(why, cap, &len, " (one of: ", 1);
        list_names(table, "", why, cap, &len);
        sp_opt_list_add(why, cap, &len, ")", 1);
    } else {
        sp_opt_list_add(why, cap, &len, " (try 'help')", 1);
    }
    return NULL;
}

const sp_cmd *sp_cmd_find(const char *name, char *why, size_t cap) { return sp_cmd_find_in(NULL, name, why, cap); }

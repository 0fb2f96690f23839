#!/usr/bin/env bash
# The main job: install dependencies, build, fetch + convert the shipped model (stories15M), start a local
# swarm of three sepal-server processes on loopback (two blocks each), generate through it, prompt-tune it on
# the sentiment task for a few steps (the data: scripts/fetch-sentiment.sh), all in the TUI: the swarm, the
# route, the text streaming and the loss curve on one screen, and then you at its `:` command line with the
# swarm up (`:help`, `?` for the keys, `q` quits and stops the swarm). Without a terminal it is the line front
# end reading commands from stdin, so `scripts/demo.sh < /dev/null` just runs the scripted demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
model=$(scripts/fetch-model.sh build/app/sepal | tail -n 1)
scripts/fetch-sentiment.sh > /dev/null
build/app/sepal model info "$model"
echo
exec build/app/sepal -c "load $model" -f share/demo.sepal --tui

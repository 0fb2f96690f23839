#!/usr/bin/env bash
# The main job: install dependencies, build, fetch + convert the shipped model (stories15M), start a local
# swarm of three sepal-server processes on loopback (two blocks each), generate through it, prompt-tune it on
# the sentiment task for a few steps (the data: scripts/fetch-sentiment.sh), then leave you
# in the REPL with the swarm up (type `help`; `quit` stops the swarm). Without a terminal the REPL part
# reads commands from stdin, so `scripts/demo.sh < /dev/null` just runs the scripted demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
model=$(scripts/fetch-model.sh build/app/sepal | tail -n 1)
scripts/fetch-sentiment.sh > /dev/null
build/app/sepal model info "$model"
echo
exec build/app/sepal -c "load $model" -f share/demo.sepal --repl

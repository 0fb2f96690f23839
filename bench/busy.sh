# busy.sh - sourced by the benches that measure under contention (llama.sh for compare.sh and prefill.sh, swarm.sh):
# a temporary directory tmp and the busy processes (start_busy: two `yes`, each wanting a core for as long as it
# runs; stop_busy), both gone at exit.
tmp="$(mktemp -d)"
busy_pids=()
stop_busy() {
    local p
    for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${busy_pids[@]}"; do wait "$p" 2>/dev/null || true; done
    busy_pids=()
}
trap 'stop_busy; rm -rf "$tmp"' EXIT
start_busy() { # two processes that want a core each for as long as they run
    local i
    for i in 1 2; do
        yes >/dev/null &
        busy_pids+=($!)
    done
}

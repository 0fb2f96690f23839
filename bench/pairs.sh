# pairs.sh - what the benches that compare a swarm with one process share (sourced by swarm.sh, scale.sh, wan.sh,
# bandwidth.sh and ttft.sh): the median, the lines of a session's output between markers, and the `sepal -c`
# commands of pairs run in turns.

between() { awk -v m="$2" '$0 ~ /^@@/ {on = ($0 == m); next} on' "$1"; } # the lines after marker m, to the next

median() { sort -g | awk '{v[NR] = $1} END {if (!NR) print 0; else print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# pairs_script GEN ONE R: sets pairs_cmds to "; " + R pairs of the commands GEN (the swarm) and ONE (one process),
# in turns (the swarm first in odd pairs), each after a marker line "@@swarm K" / "@@one K"; sets order to their
# kinds in command order (swarm one one swarm ...).
pairs_script() {
    local k
    pairs_cmds="" order=()
    for k in $(seq 1 "$3"); do
        if [ $((k % 2)) -eq 1 ]; then
            pairs_cmds="$pairs_cmds; echo @@swarm $k; $1; echo @@one $k; $2"
            order+=(swarm one)
        else
            pairs_cmds="$pairs_cmds; echo @@one $k; $2; echo @@swarm $k; $1"
            order+=(one swarm)
        fi
    done
}

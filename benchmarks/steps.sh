# Shared by the benchmarks/session*_h200*.sh device scripts: `step NAME SECONDS CMD...` runs CMD with a time limit,
# its output in $R/NAME.log, and appends "NAME: exit N after S s" to $R/steps.txt. Source it after setting R.
step() {
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$R/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - t0)) s (limit $limit s)" | tee -a "$R/steps.txt"
}

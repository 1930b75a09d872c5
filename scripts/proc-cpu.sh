# Sourced by the measurement scripts (not run on its own): `cpu_ns PID` prints the
# nanoseconds every thread of process PID has spent on a CPU, from
# /proc/PID/task/*/schedstat (its first field), so that a run's CPU is the difference
# of two readings.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }

# `idle_path` prints how this machine's idle CPUs wait for work: the cpuidle driver and,
# under KVM's haltpoll driver, how long the guest polls before it halts the vCPU
# (guest_halt_poll_ns; 0 halts at once). On a VM a wake-up from a halt goes through the
# host, and that sets the floor of every loopback latency figure, moat's and its peers'.
halt_poll_file=/sys/module/haltpoll/parameters/guest_halt_poll_ns
idle_path() {
    local d=/sys/devices/system/cpu/cpuidle p=$halt_poll_file
    local driver=none governor=none
    [[ -r $d/current_driver ]] && read -r driver <"$d/current_driver"
    [[ -r $d/current_governor_ro ]] && read -r governor <"$d/current_governor_ro"
    [[ -r $d/current_governor ]] && read -r governor <"$d/current_governor"
    printf 'idle: driver %s, governor %s' "$driver" "$governor"
    if [[ -r $p ]]; then printf ', guest_halt_poll_ns %s' "$(<"$p")"; fi
    echo
}

# Sourced by the measurement scripts (not run on its own): `cpu_ns PID` prints the
# nanoseconds every thread of process PID has spent on a CPU, from
# /proc/PID/task/*/schedstat (its first field), so that a run's CPU is the difference
# of two readings.
cpu_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'; }

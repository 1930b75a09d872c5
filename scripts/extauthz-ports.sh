# Sourced by scripts/extauthz-perf and scripts/extauthz-cost (not run on its own): free
# loopback ports for every server they start, and bench/extauthz's configs copied into
# $out with their fixed ports replaced (the machine may be shared). Sets P_DEC (decision
# listener), P_DADM, P_GW (gateway listener), P_GADM, P_UP (upstream), P_OPA (OPA's gRPC),
# P_OREST (OPA's REST API), P_NG (nginx alone), P_NGM (nginx + auth_request), P_ALLOW
# (extauthz-allow, the benchmark's floor), P_FLOOR (`moat bench upstream` as a do-nothing
# gRPC provider), P_GW2 and P_GADM2 (a second gateway whose provider is that floor).
# free_ports and wait_port for the scripts that source this file.
. scripts/loopback.sh
read -r P_DEC P_DADM P_GW P_GADM P_UP P_OPA P_OREST P_NG P_NGM P_ALLOW P_FLOOR P_GW2 P_GADM2 < <(free_ports 13)
for f in moat.yaml custom.yaml policies.yaml custom-policies.yaml; do
  sed -e "s/127.0.0.1:19191/127.0.0.1:$P_DEC/; s/127.0.0.1:19901/127.0.0.1:$P_DADM/" \
      -e "s/127.0.0.1:19480/127.0.0.1:$P_GW/; s/127.0.0.1:19902/127.0.0.1:$P_GADM/" \
      -e "s/127.0.0.1:18480/127.0.0.1:$P_UP/; s/port: 19192/port: $P_OPA/" \
      "bench/extauthz/$f" >"$out/$f"
done

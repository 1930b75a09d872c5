# Sourced by scripts/engine-cost and scripts/engine-footprint (not run on its own), after
# they set MOAT, CONFIG and POST_BODY: `engines`, the engine sets `moat bench cost`
# measures for $CONFIG (each alone, all together, none), and `case_args CASE`, which sets
# the array `args` to the request of a case (get, or post with the JSON body $POST_BODY).
engines=$("$MOAT" bench cost "$CONFIG" -n 1 --json | python3 -c 'import json,sys; print(" ".join(r["engines"] for r in json.load(sys.stdin)))')
case_args() {
  case $1 in
    get) args=(-X GET --path '/api/items?page=1' -H 'accept: */*') ;;
    post) args=(-X POST --path /api/items -H 'content-type: application/json' --body-file "$POST_BODY") ;;
    *) echo "$(basename "$0"): unknown case $1 (get, post)" >&2; exit 2 ;;
  esac
}

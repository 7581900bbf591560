#!/usr/bin/env bash
# Device command right after experiments/ab.sh on the same warm machine
# (machines come seldom: this spares a second start): installs the variant
# the A/B picked (the last line of /tmp/ab_pick.txt, experiments/pick.py's
# choice among ab.sh's CANDIDATES, which ab.sh leaves on the machine), or
# $WINNER on a fresh machine, as the root modules, then runs the whole GPU
# suite and the standing on it (scripts/gpu_session.sh, about 570 s), and
# packs the rest of $OUT (experiments/pack_out.sh).
# Carry what ab.sh carried. The modules' jax_ar/PREBUILT names the
# variant's commit (branch ab-NAME of experiments/prepare.sh), which main
# then takes: `git merge --ff-only ab-NAME`, or `git cherry-pick ab-NAME`
# where main moved since (the same cuda/ tree under another hash: say so
# beside the results).
#
#   bash experiments/land.sh
set -u
cd "$(dirname "$0")/.."
winner="${WINNER:-}"
if [ -z "$winner" ]; then
  if [ ! -e /tmp/ab_pick.txt ]; then
    echo "no A/B on this machine: pass WINNER=NAME"; exit 3
  fi
  winner=$(tail -n 1 /tmp/ab_pick.txt)
fi
if [ "$winner" = none ]; then echo "no variant to land"; exit 0; fi
rm -rf "ab/m$winner" && mkdir -p "ab/m$winner" && tar -xzf "ab/$winner.tar.gz" -C "ab/m$winner" \
  || exit 1
cp "ab/m$winner"/jax_ar/_jax_ar_*.so "ab/m$winner/jax_ar/PREBUILT" jax_ar/ || exit 1
echo "landing $winner: $(cat jax_ar/PREBUILT)"
bash scripts/gpu_session.sh
rc=$?
# The summary, the logs and the standing come back as files, the rest
# packed (the device tool brings back eight files).
bash experiments/pack_out.sh "${OUT:-gpu_results}" summary.txt suite_log.txt tests.log \
  standing.jsonl latency.jsonl table.md pick.txt
exit $rc

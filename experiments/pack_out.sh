#!/usr/bin/env bash
# The device tool brings back at most eight files of $OUT: keeps the named
# files of DIR as they are and packs every other entry into DIR/rest.tgz.
# Refuses (exit 2, DIR untouched) when the named files present and rest.tgz
# would still be more than eight.
#
#   bash experiments/pack_out.sh DIR NAME...
set -euo pipefail
dir="$1"; shift
kept=0
for name in "$@"; do [ -f "$dir/$name" ] && kept=$((kept + 1)); done
others=()
while IFS= read -r entry; do
  keep=0
  for name in "$@"; do [ "$entry" = "$name" ] && keep=1; done
  [ "$keep" = 0 ] && others+=("$entry")
done < <(ls -A "$dir")
[ "${#others[@]}" = 0 ] && exit 0
if [ $((kept + 1)) -gt 8 ]; then
  echo "pack_out: $kept named files and rest.tgz are more than 8" >&2; exit 2
fi
tar -czf "$dir/.rest.tgz" -C "$dir" "${others[@]}"
(cd "$dir" && rm -rf "${others[@]}")
mv "$dir/.rest.tgz" "$dir/rest.tgz"

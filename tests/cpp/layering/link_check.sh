#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest check (layering.no_calls_upward): no layer's static library calls a symbol that only a
# layer above it defines. The include checks catch a private header included the wrong way; this
# catches a call the wrong way through a public header (the core calling CheckpointManager::open,
# which the tier layer defines, say).
#
# usage: link_check.sh NM LIBDIR LAYER... (bottom up, as FASTPERSIST_LAYERS lists them)
set -euo pipefail
nm_tool=$1 libdir=$2
shift 2
layers=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for layer in "${layers[@]}"; do
  lib="$libdir/libfastpersist_$layer.a"
  [[ -f $lib ]] || { echo "missing $lib"; exit 1; }
  "$nm_tool" --defined-only "$lib" 2>/dev/null | awk 'NF == 3 && $2 ~ /^[TWVDRB]$/ {print $3}' |
    sort -u > "$work/def_$layer"
  "$nm_tool" --undefined-only "$lib" 2>/dev/null | awk 'NF >= 2 && $1 == "U" {print $2}' |
    sort -u > "$work/und_$layer"
done
bad=0
for ((i = 0; i < ${#layers[@]}; ++i)); do
  for ((j = i + 1; j < ${#layers[@]}; ++j)); do
    below=${layers[i]} above=${layers[j]}
    # Weak and inline symbols (templates, inline functions) are defined wherever they are used:
    # only what the upper layer alone defines counts.
    comm -12 "$work/und_$below" "$work/def_$above" > "$work/hits"
    for ((k = 0; k <= i; ++k)); do
      comm -23 "$work/hits" "$work/def_${layers[k]}" > "$work/left" && mv "$work/left" "$work/hits"
    done
    if [[ -s $work/hits ]]; then
      bad=1
      echo "layer '$below' calls into '$above', which is above it:"
      head -n 10 "$work/hits" | c++filt | sed 's/^/  /'
    fi
  done
done
if ((bad)); then exit 1; fi
echo "no layer calls into a layer above it (${layers[*]})"

#!/bin/bash
# pipeline.sh's PY for a dry run of its control flow on a CPU machine: prints the command and
# writes the .txt/.json its --out names, with a passing SUMMARY (FAIL=1 in the environment: a
# failing one), so that the gates and the order of the parts can be checked without a device.
echo "dry_py: $*"
out=""
while [ $# -gt 0 ]; do
  [ "$1" = --out ] && out=$2
  shift
done
if [ -n "$out" ]; then
  if [ "${FAIL:-0}" = 1 ]; then echo "FAIL step dry" > "$out.txt"; else echo "PASS step dry" > "$out.txt"; fi
  echo "SUMMARY pass=1 fail=${FAIL:-0} errors=0 elapsed=0s" >> "$out.txt"
  echo "time L=16384 dry" >> "$out.txt"
  echo "{}" > "$out.json"
fi

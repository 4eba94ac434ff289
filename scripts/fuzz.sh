#!/usr/bin/env bash
# fuzz.sh SECONDS [NAME...]: build the libFuzzer harnesses (make fuzz) and run each (all by default:
# safetensors llmc shard index tokenizer bpe tokjson state manifest cluster hfconfig) for SECONDS, from the seed corpus that
# tests/fuzz/seeds.py writes plus what earlier runs kept in build/fuzz/corpus/NAME. Fails on any
# crash, sanitizer report, leak, input slower than 1 s (-timeout=1) or allocation over 100 MB
# (-malloc_limit_mb); the input is kept in build/fuzz/artifacts/. Prints executions per harness.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:?usage: scripts/fuzz.sh SECONDS [NAME...]}"
shift
names="${*:-safetensors llmc shard index tokenizer bpe tokjson state manifest cluster hfconfig}"
make --no-print-directory -j2 fuzz >/dev/null
seeds=build/fuzz/seeds
rm -rf "$seeds"
/usr/bin/env python3 tests/fuzz/seeds.py "$seeds"
mkdir -p build/fuzz/artifacts
export TMPDIR="${TMPDIR:-/tmp}"
export ASAN_OPTIONS="quarantine_size_mb=16:detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
status=0
for n in $names; do
	corpus="build/fuzz/corpus/$n"
	mkdir -p "$corpus"
	log="build/fuzz/$n.log"
	if build/fuzz/fuzz_"$n" -max_total_time="$secs" -timeout=1 -rss_limit_mb=512 -malloc_limit_mb=100 \
		-max_len=65536 -print_final_stats=1 -artifact_prefix="build/fuzz/artifacts/$n-" \
		"$corpus" "$seeds/$n" >"$log" 2>&1; then
		runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
		printf 'fuzz %-12s %10s executions in %ss, 0 crashes\n' "$n" "${runs:-?}" "$secs"
	else
		status=1
		printf 'fuzz %-12s FAILED (log: %s)\n' "$n" "$log"
		grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | head -n 8 || true
	fi
done
exit $status

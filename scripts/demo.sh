#!/usr/bin/env bash
# demo.sh: what `make demo` shows: data-parallel training of a small GPT on the English fortunes of
# Debian's `fortunes` package with 2 processes, then text sampled from the trained model.
#
#   1. prepare: every fortune file directly in /usr/share/games/fortunes (not the .dat indexes nor
#      the .u8 links) -> byte-level token shards, one document per fortune (`--doc-sep %`);
#   2. train: `loom train --nproc 2` (2 ranks of 1 thread each through `loom run`): a byte-level GPT
#      (L4 H4 C128, context 128, 0.84M parameters), 3000 steps of 2 x 4 x 128 tokens (3M tokens, a
#      little more than one epoch): about 2 minutes on a quiet 2-core machine, 4-5 on a busy one. A
#      progress line every 50 steps (loss, tokens/s, MFU, all-reduce time and its exposed part, ETA),
#      the validation loss every 500 (from 5.5 = ln 257 down to about 1.9), a checkpoint at the end;
#   3. sample: `loom sample` from the checkpoint: three new "fortunes";
#   4. plot: `loom plot` draws the loss, validation loss and tokens/s of the run into $DIR/train.png
#      (gnuplot; without it $DIR/train.svg) and names the file.
#
# usage: scripts/demo.sh [LOOM (default build/loom)] [DIR (default build/demo)]
#   env: DEMO_STEPS (default 3000) for a shorter or longer run; DEMO_NPROC (default 2).
set -euo pipefail
LOOM=${1:-build/loom}
DIR=${2:-build/demo}
STEPS=${DEMO_STEPS:-3000}
NPROC=${DEMO_NPROC:-2}
FORTUNES=/usr/share/games/fortunes

[ -x "$LOOM" ] || { echo "demo: $LOOM not found (run make first)" >&2; exit 1; }
mapfile -t FILES < <(find "$FORTUNES" -maxdepth 1 \( -type f -o -type l \) ! -name '*.dat' ! -name '*.u8' \
	2>/dev/null | sort)
[ "${#FILES[@]}" -gt 0 ] || { echo "demo: no fortune files in $FORTUNES (apt-get install fortunes)" >&2; exit 1; }
mkdir -p "$DIR"

echo "== 1/4  corpus: ${#FILES[@]} fortune files from $FORTUNES -> $DIR/data"
"$LOOM" data prepare --input "${FILES[@]}" --out "$DIR/data" --doc-sep % --val-fraction 0.02

echo
echo "== 2/4  training a GPT with $NPROC processes ($STEPS steps of $NPROC x 4 x 128 tokens; a few minutes)"
rm -rf "$DIR/ckpt"
t0=$(date +%s)
"$LOOM" train --nproc "$NPROC" --train-data "$DIR/data/train_*.bin" --val-data "$DIR/data/val_*.bin" \
	--n-layer 4 --n-head 4 --n-embd 128 --vocab-size 257 --seq-len 128 \
	--batch-size 4 --total-batch-size $((4 * 128 * NPROC)) --steps "$STEPS" \
	--lr 3e-3 --warmup 50 --min-lr-frac 0.1 --weight-decay 0.1 --shuffle 1 \
	--eval-every 500 --eval-batches 64 --save-dir "$DIR/ckpt" --log "$DIR/train.jsonl" --print-every 50
t1=$(date +%s)
echo "trained in $((t1 - t0)) s; checkpoint: $(ls -d "$DIR"/ckpt/step_* | tail -1); log: $DIR/train.jsonl"

echo
echo "== 3/4  three fortunes sampled from the trained model (loom sample --model $DIR/ckpt)"
for seed in 1 2 3; do
	echo "%"
	"$LOOM" sample --model "$DIR/ckpt" --max-tokens 127 --temperature 0.8 --top-k 40 --seed "$seed" | sed '/^\s*$/d'
done
echo "%"

echo
PLOT="$DIR/train.png"
command -v gnuplot >/dev/null 2>&1 || PLOT="$DIR/train.svg"
echo "== 4/4  the training curves (loom plot $DIR/train.jsonl -o $PLOT)"
"$LOOM" plot "$DIR/train.jsonl" -o "$PLOT" --title "loom demo: byte-level GPT on fortunes, $NPROC ranks"
echo "demo: done. Plot: $PLOT. More: $LOOM sample --model $DIR/ckpt --prompt 'Q: ' --seed 7"

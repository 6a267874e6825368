#!/bin/bash
# The jacobi_tol training comparison (docs/jacobi.md, Jacobi options): config/tiny_t2mlr.py, fixed D = 16 vs jacobi_tol = 0.05, seeds 1 and 2.
# The two arms of a seed run at the same time, one thread each on their own core (same contention).
cd "$(dirname "$0")/../.."   # the repository root
run() {  # arm seed core extra
  out=out/jacobi_tol/$1_s$2
  init=scratch; [ -f $out/ckpt.pt ] && init=resume
  [ -f $out/done ] && return
  start=$(date +%s.%N)
  OMP_NUM_THREADS=1 taskset -c $3 python train.py config/tiny_t2mlr.py --seed=$2 --out_dir=$out --init_from=$init --progress=False $4 > $out.log 2>&1 \
    && echo "{\"wall_s\": $(echo "$(date +%s.%N) - $start" | bc)}" > $out/done
}
for s in 1 2; do
  mkdir -p out/jacobi_tol/fixed_s$s out/jacobi_tol/tol_s$s
  run fixed $s 0 "" &
  run tol $s 1 "--jacobi_tol=0.05" &
  wait
done
# then: python -m studies.reproduce tolerance --fixed out/jacobi_tol/fixed_s1 out/jacobi_tol/fixed_s2 \
#           --tol out/jacobi_tol/tol_s1 out/jacobi_tol/tol_s2 --data_dir data/pydoc --out studies/results/jacobi_tol.json

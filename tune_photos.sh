# usage: tune_proto.sh PROTOCOL  -- two tune processes of one torch thread each, methods split by cost
P=$1
cd /work/tune
PY=/work/main/.venv/bin/python
A=normalized_softmax,binomial_deviance,proxy_nca_pp,multi_similarity,lifted_structure,contrastive,quadruplet_euclidean,proxy_anchor,quadruplet_random,quadruplet_method2,soft_triple,hdc_contrastive,lmdm_score,pddm_score
B=npairs,histogram,proxy_nca,cosface,triplet_global,supcon,arcface,triplet,circle,quadruplet_method1,margin,hdc_contrastive_independent,pddm_quadruplet,pddm_triplet
OMP_NUM_THREADS=1 $PY -m harness tune --protocol $P --method $A --trials 20 --results-dir results/reference > /tmp/tune_${P}_A.log 2>&1 &
sleep 20
OMP_NUM_THREADS=1 $PY -m harness tune --protocol $P --method $B --trials 20 --results-dir results/reference > /tmp/tune_${P}_B.log 2>&1 &
wait
echo "$P study done $(date)"

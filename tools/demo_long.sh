# usage: demo_long.sh TAG STEPS  (env passes through): a long GPU demo, its verdict and step outliers;
# the collector's input is dumped to in_TAG.pkl (python -m dtrace_mk.collectors.replay)
L=/tmp/gpu_session_logs; tag=$1
env -u OUT DTRACE_MK_COLLECTOR_DUMP=$L/in_${tag}.pkl dtrace-mk demo --steps $2 --spans $L/s_${tag}.jsonl > $L/demo_${tag}.log 2>&1; echo "rc=$?"
grep -E "served|verdict|rooted|slow_task|local_imb|late_" $L/demo_${tag}.log | head -8
python3 tools/spans_table.py $L/s_${tag}.jsonl --outliers | tail -12

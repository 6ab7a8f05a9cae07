# usage: demo3.sh TAG N  (env passes through)
L=/tmp/gpu_session_logs; tag=$1
for i in $(seq 1 $2); do
  env -u OUT dtrace-mk demo --spans $L/s_${tag}_$i.jsonl > $L/demo_${tag}_$i.log 2>&1; echo "rc=$?"
  grep -E "finding|remote_stall|slow_task|local_imb|late_|verdict" $L/demo_${tag}_$i.log | head -8
  python3 tools/spans_table.py $L/s_${tag}_$i.jsonl | awk '$1<=9 || /finding/'
done

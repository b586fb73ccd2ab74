# Runs inside the VM. The script's status is the demo's: it fails unless both reads are denied.
mkdir -p /srv/secrets && echo "the launch codes" > /srv/secrets/token && echo "hello" > /srv/public.txt

echo '--- palisade run: one command under a policy'
echo '$ palisade run --policy examples/protect-secrets.yaml -- sh -c "cat /srv/public.txt; cat /srv/secrets/token"'
palisade run --policy examples/protect-secrets.yaml -- sh -c 'cat /srv/public.txt; cat /srv/secrets/token'
run_status=$?
echo "(palisade run exited with $run_status: cat's status after the denied read)"

echo '--- palisade agent: every policy in examples/, here protecting the cgroup palisade-demo'
mkdir -p /sys/fs/cgroup/palisade-demo
palisade agent --policy-dir examples --events /tmp/events.jsonl &
agent=$!
workload() {
  sh -c 'echo $$ > /sys/fs/cgroup/palisade-demo/cgroup.procs && cat /srv/public.txt && exec cat /srv/secrets/token'
}
agent_denied=no
for attempt in $(seq 1 60); do
  if ! workload >/dev/null 2>&1; then agent_denied=yes; break; fi
  sleep 1
done
echo '$ (in cgroup palisade-demo) cat /srv/public.txt; cat /srv/secrets/token'
workload
kill -TERM $agent
wait $agent
echo '$ cat /tmp/events.jsonl   # the agent'"'"'s audit events'
cat /tmp/events.jsonl
[ "$run_status" -eq 1 ] && [ "$agent_denied" = yes ]

# Runs inside the VM. The script's status is the demo's: it fails unless both reads are denied
# with EPERM and reported.
mkdir -p /srv/secrets && echo "the launch codes" > /srv/secrets/token && echo "hello" > /srv/public.txt

echo '--- palisade run: one command under a policy'
echo '$ palisade run --policy examples/protect-secrets.yaml --events /tmp/run-events.jsonl -- sh -c "cat /srv/public.txt; cat /srv/secrets/token"'
palisade run --policy examples/protect-secrets.yaml --events /tmp/run-events.jsonl -- \
  sh -c 'cat /srv/public.txt; cat /srv/secrets/token' 2>&1 | tee /tmp/run.out
cat /tmp/run-events.jsonl
run_denied=no
grep -q "can't open '/srv/secrets/token': Operation not permitted" /tmp/run.out &&
  grep -q '"action":"deny".*"path":"/srv/secrets/token"' /tmp/run-events.jsonl && run_denied=yes

echo '--- palisade agent: every policy in examples/, here protecting the cgroup palisade-demo'
mkdir -p /sys/fs/cgroup/palisade-demo
palisade agent --policy-dir examples --events /tmp/events.jsonl &
agent=$!
workload() {
  sh -c 'echo $$ > /sys/fs/cgroup/palisade-demo/cgroup.procs && cat /srv/public.txt && exec cat /srv/secrets/token'
}
agent_denied=no
for attempt in $(seq 1 60); do
  if workload 2>&1 | grep -q "Operation not permitted"; then agent_denied=yes; break; fi
  sleep 1
done
echo '$ (in cgroup palisade-demo) cat /srv/public.txt; cat /srv/secrets/token'
workload
kill -TERM $agent
wait $agent
echo '$ cat /tmp/events.jsonl   # the agent'"'"'s audit events'
cat /tmp/events.jsonl
grep -q '"action":"deny".*"path":"/srv/secrets/token"' /tmp/events.jsonl || agent_denied=no
echo "denied and reported: palisade run: $run_denied, palisade agent: $agent_denied"
[ "$run_denied" = yes ] && [ "$agent_denied" = yes ]

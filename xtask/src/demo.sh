# Runs inside the VM: `palisade run` with the example policy. The script's status is the demo's.
mkdir -p /srv/secrets && echo "the launch codes" > /srv/secrets/token && echo "hello" > /srv/public.txt
echo '$ palisade run --policy examples/protect-secrets.yaml -- sh -c "cat /srv/public.txt; cat /srv/secrets/token"'
palisade run --policy examples/protect-secrets.yaml -- sh -c 'cat /srv/public.txt; cat /srv/secrets/token'
status=$?
echo "(palisade run exited with $status: cat's status after the denied read)"
[ "$status" -eq 1 ]

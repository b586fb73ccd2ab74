# Example rule module in Rego that widens a DefenseInDepth allowlist with what programs need now
# and then, which a short model can miss: name resolution as glibc 2.34 and later does it (its
# files, DNS to `resolvers`, the routing socket getaddrinfo asks for addresses, nscd's socket),
# CA certificates (`certificates`) and time zones (`time_zones`).
#
#   config: {resolvers: [10.96.0.10], certificates: true, time_zones: true}
#
# Built with `palisade rules build DIR` (opa build -t wasm -e palisade/compile -e palisade/decide).
package palisade

default resolvers := []

resolvers := r if r := input.config.resolvers

read(name, paths) := {"name": name, "action": "allow", "files": {"paths": paths, "permissions": ["read"]}}

default name_resolution := []

name_resolution := [
	read("name-resolution", ["/etc/hosts", "/etc/nsswitch.conf", "/etc/resolv.conf", "/etc/host.conf", "/etc/gai.conf", "/etc/services", "/etc/protocols"]),
	{
		"name": "dns",
		"action": "allow",
		"network": {"addresses": resolvers, "ports": [53], "protocols": ["udp", "tcp"]},
	},
	{
		"name": "dns-sockets",
		"action": "allow",
		"sockets": [
			{"family": "inet", "types": ["dgram", "stream"]},
			{"family": "inet6", "types": ["dgram", "stream"]},
			{"family": "netlink", "types": ["raw"]},
			{"family": "unix", "types": ["stream"]},
		],
	},
	{"name": "nscd", "action": "allow", "unix_sockets": ["/run/nscd/socket"]},
] if count(resolvers) > 0

default certificates := []

certificates := [read("certificates", ["/etc/ssl/certs/**", "/usr/share/ca-certificates/**", "/usr/lib/ssl/**"])] if input.config.certificates

default time_zones := []

time_zones := [read("time-zones", ["/etc/localtime", "/usr/share/zoneinfo/**"])] if input.config.time_zones

compile := [rule | some part in [name_resolution, certificates, time_zones]; some rule in part]

# Allow rules cause no events: the policy's other events go on unchanged.
default decide := {}

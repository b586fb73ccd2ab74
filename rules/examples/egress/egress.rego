# Example rule module in Rego: outgoing TCP to the configured addresses (and ports) is denied;
# attempts by root are rated critical, others high; processes named in `quiet` are not reported.
#
#   config: {addresses: [169.254.169.254], ports: [80], quiet: [health-check]}
#
# Built with `palisade rules build DIR` (opa build -t wasm -e palisade/compile -e palisade/decide).
package palisade

default ports := []

ports := p if p := input.config.ports

default quiet := []

quiet := q if q := input.config.quiet

compile := [{
	"name": "egress",
	"action": "deny",
	"network": {"addresses": input.config.addresses, "ports": ports, "protocols": ["tcp"]},
}] if count(input.config.addresses) > 0

compile := {"error": "`addresses` lists nothing to block"} if count(input.config.addresses) == 0

is_quiet if quiet[_] == input.event.comm

default decide := {"keep": true}

decide := {"keep": false} if is_quiet

decide := verdict("critical") if {
	not is_quiet
	input.event.uid == 0
}

decide := verdict("high") if {
	not is_quiet
	input.event.uid != 0
}

verdict(severity) := {
	"keep": true,
	"severity": severity,
	"tags": ["egress"],
	"annotations": {"destination": input.event.socket.address},
}

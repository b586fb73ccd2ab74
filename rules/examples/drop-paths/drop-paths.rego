# Example model transform in Rego: the files and programs of a behaviour model under the
# configured prefixes are dropped from it.
#
#   palisade model to-policy web.yaml --module drop-paths.wasm --config '{"prefixes": ["/proc/"]}'
#
# Built with `palisade rules build DIR` (opa build -t wasm -e palisade/transform).
package palisade

dropped(path) if {
	some prefix in input.config.prefixes
	startswith(path, prefix)
}

transform := object.union(input.model, {
	"files": [file | some file in input.model.files; not dropped(file.path)],
	"executables": [program | some program in input.model.executables; not dropped(program.path)],
}) if count(input.config.prefixes) > 0

transform := {"error": "`prefixes` lists nothing to drop"} if count(input.config.prefixes) == 0

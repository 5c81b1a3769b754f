# Loading a .policy into a new PolicyRunner through Godot's File, so res:// paths work in exported games.
#   var runner = preload("res://policyport.gd").load_runner("res://cartpole.policy", 7, true)
const PolicyRunner = preload("res://policy_runner.gdns")


static func load_runner(path: String, rng_seed: int, sample: bool):
	var f = File.new()
	if f.open(path, File.READ) != OK:
		push_error("policyport: cannot open %s" % path)
		return null
	var bytes = f.get_buffer(f.get_len())
	f.close()
	var runner = PolicyRunner.new()
	if not runner.load_bytes(bytes, rng_seed, sample):
		push_error("policyport: %s" % runner.last_error())
		return null
	return runner

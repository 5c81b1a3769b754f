# 64 CartPoles as nodes of the group "policyport_agents", one PolicyAgents node acting for all of them each
# physics frame; at frame 300 one cart is freed and a new one added (its id released, a new agent spawned). After
# 600 frames: prints the finished episodes and their mean return, then quits. POLICYPORT_POLICY names the policy.
extends Node

const CARTS = 64
const FRAMES = 600
var frames = 0
var returns = []
var agents
var cart_script = preload("res://cart.gd")


func _ready() -> void:
	agents = preload("res://policy_agents.gd").new()
	agents.policy_path = OS.get_environment("POLICYPORT_POLICY")
	agents.rng_seed = 7
	add_child(agents)
	for i in CARTS:
		_add_cart(i)


func _add_cart(i: int) -> void:
	var cart = Node.new()
	cart.set_script(cart_script)
	cart.name = "Cart%d" % i
	cart.connect("finished", self, "_on_finished")
	add_child(cart)
	cart.add_to_group("policyport_agents")


func _on_finished(ret) -> void:
	returns.append(ret)


func _physics_process(_delta: float) -> void:
	frames += 1
	if frames == FRAMES / 2:
		get_node("Cart0").free()
		_add_cart(CARTS)
	if frames >= FRAMES:
		var total = 0.0
		for r in returns:
			total += r
		var alive = agents.runner.info()["alive"] if agents.runner else -1
		print("godot3 group: %d carts, %d frames, %d agents alive, %d episodes finished, mean return %.2f" % [CARTS, FRAMES, alive, returns.size(), total / max(1, returns.size())])
		get_tree().quit()

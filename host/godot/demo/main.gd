# 64 CartPoles as nodes of the group "policyport_agents", one PolicyAgents node acting for all of them each
# physics frame. After 600 frames: prints the finished episodes and their mean return, then quits.
extends Node

const CARTS := 64
const FRAMES := 600
var frames := 0
var returns: Array[float] = []

func _ready() -> void:
	var agents = PolicyAgents.new()
	agents.policy_path = "res://cartpole.policy"
	agents.seed = 7
	add_child(agents)
	var cart_script = load("res://cart.gd")
	for i in CARTS:
		var cart = Node.new()
		cart.set_script(cart_script)
		cart.name = "Cart%d" % i
		cart.finished.connect(func(ret): returns.append(ret))
		add_child(cart)
		cart.add_to_group("policyport_agents")

func _physics_process(_delta: float) -> void:
	frames += 1
	if frames >= FRAMES:
		var total := 0.0
		for r in returns:
			total += r
		var mean: float = total / max(1, returns.size())
		print("godot: %d carts, %d frames, %d episodes finished, mean return %.2f" % [CARTS, FRAMES, returns.size(), mean])
		get_tree().quit(0 if returns.size() > 0 else 1)

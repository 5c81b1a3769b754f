# CartPole-v1 (Gymnasium) dynamics in host/capi/examples/agents.c's operation order, double precision (GDScript's
# float), shared by the demo scenes: one step of `s` ([x, x_dot, theta, theta_dot], changed in place) under
# `action` (0: push left, 1: push right); true when the pole fell or the cart left the track.


static func step(s: Array, action: int) -> bool:
	var force = 10.0 if action == 1 else -10.0
	var costheta = cos(s[2])
	var sintheta = sin(s[2])
	var temp = (force + 0.05 * s[3] * s[3] * sintheta) / 1.1
	var thetaacc = (9.8 * sintheta - costheta * temp) / (0.5 * (4.0 / 3.0 - 0.1 * costheta * costheta / 1.1))
	var xacc = temp - 0.05 * thetaacc * costheta / 1.1
	s[0] += 0.02 * s[1]
	s[1] += 0.02 * xacc
	s[2] += 0.02 * s[3]
	s[3] += 0.02 * thetaacc
	return s[0] < -2.4 or s[0] > 2.4 or s[2] < -0.2094395102393195 or s[2] > 0.2094395102393195

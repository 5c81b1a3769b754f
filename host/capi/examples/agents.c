/* A game's agents driven through the policyport C ABI's agents (ABI 6): many CartPole agents, one batched act()
 * per tick, each agent respawning when its pole falls (a respawn starts a new episode), one agent despawned and a
 * new one spawned in its place midway (the new agent gets the freed env id and a fresh episode).
 *
 *   agents <cartpole.policy> [policyport_plugin.wasm] [--agents N] [--ticks T]
 *
 * With a plugin path the policy runs inside the wasm sandbox (deadline + memory cap), otherwise natively. Each
 * tick hands every alive agent's observation to pp_agents_tick in one call, in a rotating order (an engine's
 * query order is not stable), and applies the actions it writes back. Prints the episodes finished, their mean
 * return and every finished return; exits non-zero on any policyport error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policyport.h"

static void check(PpStatus s, const char *what) {
    if (s != PP_STATUS_OK) {
        fprintf(stderr, "%s failed (status %d): %s\n", what, (int)s, pp_last_error());
        exit(1);
    }
}

/* CartPole-v1 dynamics (Gymnasium), double precision; 1 when the episode ends. */
static int cartpole_step(double s[4], int64_t action) {
    const double gravity = 9.8, masscart = 1.0, masspole = 0.1, length = 0.5, force_mag = 10.0, tau = 0.02;
    const double total_mass = masspole + masscart, polemass_length = masspole * length;
    double force = action == 1 ? force_mag : -force_mag;
    double costheta = cos(s[2]), sintheta = sin(s[2]);
    double temp = (force + polemass_length * s[3] * s[3] * sintheta) / total_mass;
    double thetaacc = (gravity * sintheta - costheta * temp) /
                      (length * (4.0 / 3.0 - masspole * costheta * costheta / total_mass));
    double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    s[0] += tau * s[1];
    s[1] += tau * xacc;
    s[2] += tau * s[3];
    s[3] += tau * thetaacc;
    return s[0] < -2.4 || s[0] > 2.4 || s[2] < -0.2094395102393195 || s[2] > 0.2094395102393195;
}

typedef struct {
    uint64_t id;
    double s[4];
    double ret;
    int steps;
} Agent;

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static void reset(Agent *a) {
    for (int i = 0; i < 4; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        a->s[i] = -0.05 + 0.1 * (double)(rng >> 11) / 9007199254740992.0;
    }
    a->ret = 0.0;
    a->steps = 0;
}

int main(int argc, char **argv) {
    const char *policy_path = NULL, *plugin = NULL;
    size_t n = 64;
    int ticks = 1500;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--agents") && i + 1 < argc) n = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--ticks") && i + 1 < argc) ticks = atoi(argv[++i]);
        else if (!policy_path) policy_path = argv[i];
        else plugin = argv[i];
    }
    if (!policy_path || n == 0) {
        fprintf(stderr, "usage: %s <cartpole.policy> [policyport_plugin.wasm] [--agents N] [--ticks T]\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(policy_path, "rb");
    if (!f) { perror(policy_path); return 2; }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *bytes = malloc((size_t)len);
    if (fread(bytes, 1, (size_t)len, f) != (size_t)len) { perror("read"); return 2; }
    fclose(f);

    if (pp_abi_version() != PP_ABI_VERSION) { fprintf(stderr, "ABI mismatch\n"); return 1; }
    PpPolicy *policy = NULL;
    if (plugin)
        check(pp_policy_load_wasm(bytes, (size_t)len, plugin, 64u << 20, 1000, &policy), "pp_policy_load_wasm");
    else
        check(pp_policy_load(bytes, (size_t)len, PP_BACKEND_CPU, &policy), "pp_policy_load");
    free(bytes);
    PpAgents *agents = NULL;
    check(pp_agents_new(policy, 7, 1, 0, &agents), "pp_agents_new"); /* consumes the policy */
    PpAgentsInfo info;
    check(pp_agents_info(agents, &info), "pp_agents_info");
    if (info.obs_len != 4 || !info.discrete || info.action_len != 1) { fprintf(stderr, "not a CartPole policy\n"); return 1; }

    Agent *all = calloc(n, sizeof(Agent));
    uint64_t *ids = malloc(n * sizeof(uint64_t));
    size_t *order = malloc(n * sizeof(size_t));
    float *obs = malloc(n * 4 * sizeof(float));
    int64_t *actions = malloc(n * sizeof(int64_t));
    float *values = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        check(pp_agents_spawn(agents, &all[i].id), "pp_agents_spawn");
        reset(&all[i]);
    }
    /* A stale id is a typed error, never another agent's row. */
    uint64_t gone;
    check(pp_agents_spawn(agents, &gone), "pp_agents_spawn");
    check(pp_agents_despawn(agents, gone), "pp_agents_despawn");
    if (pp_agents_respawn(agents, gone) != PP_STATUS_BAD_CALL) { fprintf(stderr, "a stale id was accepted\n"); return 1; }

    int finished = 0;
    double total = 0.0;
    printf("returns:");
    for (int t = 0; t < ticks; t++) {
        if (t == ticks / 2) {
            /* Agent 0 leaves the game; a new agent takes its place (and its freed env id, with a new episode). */
            check(pp_agents_despawn(agents, all[0].id), "pp_agents_despawn");
            check(pp_agents_spawn(agents, &all[0].id), "pp_agents_spawn");
            reset(&all[0]);
        }
        for (size_t k = 0; k < n; k++) order[k] = (k + (size_t)t * 7) % n; /* the engine's order of the tick */
        for (size_t k = 0; k < n; k++) {
            Agent *a = &all[order[k]];
            ids[k] = a->id;
            for (int i = 0; i < 4; i++) obs[k * 4 + i] = (float)a->s[i];
        }
        check(pp_agents_tick(agents, ids, n, obs, NULL, actions, NULL, values), "pp_agents_tick");
        for (size_t k = 0; k < n; k++) {
            Agent *a = &all[order[k]];
            a->ret += 1.0;
            a->steps++;
            if (cartpole_step(a->s, actions[k]) || a->steps >= 500) {
                printf(" %.0f", a->ret);
                total += a->ret;
                finished++;
                check(pp_agents_respawn(agents, a->id), "pp_agents_respawn");
                reset(a);
            }
        }
    }
    printf("\n%s: %d agents, %d ticks, %d episodes finished, mean return %.2f\n", plugin ? "sandboxed" : "native",
           (int)n, ticks, finished, finished ? total / finished : 0.0);
    pp_agents_free(agents);
    free(all); free(ids); free(order); free(obs); free(actions); free(values);
    return finished > 0 ? 0 : 1;
}

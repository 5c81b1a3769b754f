/* A C game loop stepping a recurrent policy (an LSTM over pixels, say) through the policyport C ABI, with
 * episode starts: the loop a game writes when its agents remember.
 *
 *   rollout <policy> <rollout.txt> [policyport_plugin.wasm]
 *
 * rollout.txt (plain text, whitespace-separated): `envs steps obs_len`, then per step `envs` episode-start flags
 * (0/1) followed by `envs × obs_len` observation numbers. Runs every step for all envs at once (env ids 0..envs),
 * the flags as `episode_starts` (each flagged env's state is zeroed before its step), deterministic actions.
 * Prints one line per step: the discrete actions, then the values. With a plugin path the policy runs inside the
 * wasm sandbox. Exits non-zero on any policyport error. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "policyport.h"

static void check(PpStatus s, const char *what) {
    if (s != PP_STATUS_OK) {
        fprintf(stderr, "%s failed (status %d): %s\n", what, (int)s, pp_last_error());
        exit(1);
    }
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len);
    if (!b || fread(b, 1, *len, f) != *len) { perror("read"); exit(2); }
    fclose(f);
    return b;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s <policy> <rollout.txt> [policyport_plugin.wasm]\n", argv[0]);
        return 2;
    }
    size_t len;
    uint8_t *bytes = read_file(argv[1], &len);
    if (pp_abi_version() != PP_ABI_VERSION) { fprintf(stderr, "ABI mismatch\n"); return 1; }
    PpPolicy *policy = NULL;
    if (argc > 3)
        check(pp_policy_load_wasm(bytes, len, argv[3], 256u << 20, 1000, &policy), "pp_policy_load_wasm");
    else
        check(pp_policy_load(bytes, len, PP_BACKEND_CPU, &policy), "pp_policy_load");
    free(bytes);
    PpInfo info;
    check(pp_policy_info(policy, &info), "pp_policy_info");

    FILE *r = fopen(argv[2], "r");
    if (!r) { perror(argv[2]); return 2; }
    unsigned envs, steps, obs_len;
    if (fscanf(r, "%u %u %u", &envs, &steps, &obs_len) != 3 || obs_len != info.obs_len || !info.discrete) {
        fprintf(stderr, "rollout header does not fit the policy (obs_len %u, discrete %u)\n", info.obs_len,
                info.discrete);
        return 1;
    }
    float *obs = malloc(sizeof(float) * envs * obs_len);
    uint8_t *starts = malloc(envs);
    int64_t *actions = malloc(sizeof(int64_t) * envs * info.action_len);
    float *values = malloc(sizeof(float) * envs);
    for (unsigned t = 0; t < steps; t++) {
        for (unsigned e = 0; e < envs; e++) {
            unsigned flag;
            if (fscanf(r, "%u", &flag) != 1) { fprintf(stderr, "rollout truncated\n"); return 1; }
            starts[e] = (uint8_t)flag;
        }
        for (unsigned i = 0; i < envs * obs_len; i++)
            if (fscanf(r, "%f", &obs[i]) != 1) { fprintf(stderr, "rollout truncated\n"); return 1; }
        check(pp_policy_act(policy, obs, envs, 0, 0, 0, t, actions, NULL, info.has_value ? values : NULL, NULL,
                            starts),
              "pp_policy_act");
        for (unsigned i = 0; i < envs * info.action_len; i++) printf("%lld ", (long long)actions[i]);
        printf("|");
        for (unsigned e = 0; e < envs && info.has_value; e++) printf(" %.7g", values[e]);
        printf("\n");
    }
    fclose(r);
    free(obs); free(starts); free(actions); free(values);
    pp_policy_free(policy);
    return 0;
}

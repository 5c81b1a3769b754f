/* A C game loop driving the trained CartPole policy through the policyport C ABI.
 *
 *   cartpole <cartpole.policy> [policyport_plugin.wasm]
 *
 * With a plugin path the policy runs inside the wasm sandbox (deadline + memory cap), otherwise natively.
 * Prints the mean return over 20 seeded episodes; exits non-zero on any policyport error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "policyport.h"

static int check(PpStatus s, const char *what) {
    if (s != PP_STATUS_OK) {
        fprintf(stderr, "%s failed (status %d): %s\n", what, (int)s, pp_last_error());
        exit(1);
    }
    return 0;
}

/* CartPole-v1 dynamics (Gymnasium), double precision. */
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

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s <cartpole.policy> [policyport_plugin.wasm]\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 2; }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *bytes = malloc((size_t)len);
    if (fread(bytes, 1, (size_t)len, f) != (size_t)len) { perror("read"); return 2; }
    fclose(f);

    if (pp_abi_version() != PP_ABI_VERSION) { fprintf(stderr, "ABI mismatch\n"); return 1; }
    PpPolicy *policy = NULL;
    if (argc > 2)
        check(pp_policy_load_wasm(bytes, (size_t)len, argv[2], 64u << 20, 100, &policy), "pp_policy_load_wasm");
    else
        check(pp_policy_load(bytes, (size_t)len, PP_BACKEND_CPU, &policy), "pp_policy_load");
    free(bytes);

    PpInfo info;
    check(pp_policy_info(policy, &info), "pp_policy_info");
    if (info.obs_len != 4 || !info.discrete) { fprintf(stderr, "not a CartPole policy\n"); return 1; }

    /* A bad call is a typed error, not a crash. */
    if (pp_policy_act(policy, NULL, 1, 0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL) != PP_STATUS_NULL_POINTER) return 1;

    const int episodes = 20;
    double total = 0.0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int e = 0; e < episodes; e++) {
        double s[4];
        for (int i = 0; i < 4; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            s[i] = -0.05 + 0.1 * (double)(rng >> 11) / 9007199254740992.0;
        }
        double ret = 0.0;
        for (uint64_t t = 0; t < 500; t++) {
            float obs[4] = {(float)s[0], (float)s[1], (float)s[2], (float)s[3]};
            int64_t action;
            float value;
            check(pp_policy_act(policy, obs, 1, (uint32_t)e, 1, 7, t, &action, NULL, &value, NULL, NULL), "pp_policy_act");
            ret += 1.0;
            if (cartpole_step(s, action)) break;
        }
        total += ret;
    }
    printf("%s: mean return %.2f over %d episodes\n", info.sandboxed ? "sandboxed" : "native", total / episodes, episodes);
    pp_policy_free(policy);
    return 0;
}

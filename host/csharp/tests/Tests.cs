// The C# binding's tests (run by tests/scripts/csharp-test.sh with Mono):
//
//   mono Tests.exe <cartpole.policy> <policyport_plugin.wasm> <C cartpole output> <C agents output file>
//
// The CartPole loop of host/capi/examples/cartpole.c and the agents game of host/capi/examples/agents.c, written
// again in C# over the binding, must print what the C examples print (the same episodes), natively and sandboxed;
// typed exceptions for bad input. Prints one line per test and "N passed, M failed".
using System;
using System.Collections.Generic;
using System.IO;
using System.Text;
using Policyport;

static class Tests
{
    static int passed, failed;

    static void Test(string name, Action body)
    {
        try { body(); passed++; Console.WriteLine("ok   " + name); }
        catch (Exception e) { failed++; Console.WriteLine("FAIL " + name + ": " + e); }
    }

    static void Assert(bool cond, string what) { if (!cond) throw new Exception("assertion failed: " + what); }

    static T Throws<T>(Action body, string what) where T : Exception
    {
        try { body(); }
        catch (T e) { return e; }
        catch (Exception e) { throw new Exception(what + ": expected " + typeof(T).Name + ", got " + e.GetType().Name + ": " + e.Message); }
        throw new Exception(what + ": expected " + typeof(T).Name + ", nothing was thrown");
    }

    // CartPole-v1 dynamics (Gymnasium), double precision, as the C examples step them.
    static bool Step(double[] s, long action)
    {
        const double gravity = 9.8, masscart = 1.0, masspole = 0.1, length = 0.5, forceMag = 10.0, tau = 0.02;
        const double totalMass = masspole + masscart, polemassLength = masspole * length;
        double force = action == 1 ? forceMag : -forceMag;
        double costheta = Math.Cos(s[2]), sintheta = Math.Sin(s[2]);
        double temp = (force + polemassLength * s[3] * s[3] * sintheta) / totalMass;
        double thetaacc = (gravity * sintheta - costheta * temp) / (length * (4.0 / 3.0 - masspole * costheta * costheta / totalMass));
        double xacc = temp - polemassLength * thetaacc * costheta / totalMass;
        s[0] += tau * s[1];
        s[1] += tau * xacc;
        s[2] += tau * s[3];
        s[3] += tau * thetaacc;
        return s[0] < -2.4 || s[0] > 2.4 || s[2] < -0.2094395102393195 || s[2] > 0.2094395102393195;
    }

    static ulong rng;

    static void Reset(double[] s)
    {
        for (int i = 0; i < 4; i++)
        {
            unchecked { rng = rng * 6364136223846793005UL + 1442695040888963407UL; }
            s[i] = -0.05 + 0.1 * (double)(rng >> 11) / 9007199254740992.0;
        }
    }

    // host/capi/examples/cartpole.c in C#: 20 episodes, env id = episode, step = t, seed 7, sampled.
    static string CartPoleLoop(Policy policy)
    {
        rng = 0x9E3779B97F4A7C15UL;
        double total = 0;
        var s = new double[4];
        var obs = new float[4];
        var ids = new uint[1];
        var action = new long[1];
        var value = new float[1];
        for (int e = 0; e < 20; e++)
        {
            Reset(s);
            double ret = 0;
            ids[0] = (uint)e;
            for (ulong t = 0; t < 500; t++)
            {
                for (int i = 0; i < 4; i++) obs[i] = (float)s[i];
                policy.Act(obs, ids, true, 7, t, action, Span<float>.Empty, value);
                ret += 1.0;
                if (Step(s, action[0])) break;
            }
            total += ret;
        }
        return string.Format(System.Globalization.CultureInfo.InvariantCulture, "{0}: mean return {1:F2} over 20 episodes",
            policy.Info.Sandboxed != 0 ? "sandboxed" : "native", total / 20);
    }

    // host/capi/examples/agents.c in C#, laid out as a game would: 32 agents, one tick per frame.
    static string AgentsGame(Agents agents, bool sandboxed, int n, int ticks)
    {
        rng = 0x9E3779B97F4A7C15UL;
        var sb = new StringBuilder();
        var ids = new ulong[n];
        var states = new double[n][];
        var rets = new double[n];
        var steps = new int[n];
        var order = new int[n];
        var tickIds = new ulong[n];
        var obs = new float[n * 4];
        var actions = new long[n];
        var values = new float[n];
        for (int i = 0; i < n; i++) { ids[i] = agents.Spawn(); states[i] = new double[4]; Reset(states[i]); }
        ulong gone = agents.Spawn();
        agents.Despawn(gone);
        Throws<BadCallException>(() => agents.Respawn(gone), "a stale id");
        int finished = 0;
        double total = 0;
        sb.Append("returns:");
        for (int t = 0; t < ticks; t++)
        {
            if (t == ticks / 2)
            {
                agents.Despawn(ids[0]);
                ids[0] = agents.Spawn();
                Reset(states[0]);
                rets[0] = 0; steps[0] = 0;
            }
            for (int k = 0; k < n; k++) order[k] = (int)(((long)k + (long)t * 7) % n);
            for (int k = 0; k < n; k++)
            {
                int a = order[k];
                tickIds[k] = ids[a];
                for (int i = 0; i < 4; i++) obs[k * 4 + i] = (float)states[a][i];
            }
            agents.Tick(tickIds, obs, actions, Span<float>.Empty, values);
            for (int k = 0; k < n; k++)
            {
                int a = order[k];
                rets[a] += 1.0;
                steps[a]++;
                if (Step(states[a], actions[k]) || steps[a] >= 500)
                {
                    sb.Append(' ').Append(rets[a].ToString("F0", System.Globalization.CultureInfo.InvariantCulture));
                    total += rets[a];
                    finished++;
                    agents.Respawn(ids[a]);
                    Reset(states[a]);
                    rets[a] = 0; steps[a] = 0;
                }
            }
        }
        sb.Append('\n');
        sb.Append(string.Format(System.Globalization.CultureInfo.InvariantCulture,
            "{0}: {1} agents, {2} ticks, {3} episodes finished, mean return {4:F2}\n",
            sandboxed ? "sandboxed" : "native", n, ticks, finished, finished > 0 ? total / finished : 0.0));
        return sb.ToString();
    }

    static int Main(string[] args)
    {
        if (args.Length < 4)
        {
            Console.Error.WriteLine("usage: Tests.exe <cartpole.policy> <policyport_plugin.wasm> <C cartpole line> <C agents output file>");
            return 2;
        }
        byte[] artifact = File.ReadAllBytes(args[0]);
        string plugin = args[1], cLine = args[2].Trim(), cAgents = File.ReadAllText(args[3]);

        Test("the CartPole loop over Policy.Act prints what examples/cartpole.c prints (native)", () =>
        {
            using (var p = Policy.Load(artifact))
            {
                Assert(p.Info.ObsLen == 4 && p.Info.Discrete == 1 && p.Info.HasValue == 1, "CartPole's info");
                string got = CartPoleLoop(p);
                Console.WriteLine("     " + got);
                Assert(got == cLine, "C# '" + got + "' vs C '" + cLine + "'");
            }
        });
        Test("the same loop in the wasm sandbox plays the same episodes", () =>
        {
            using (var p = Policy.LoadSandboxed(artifact, plugin, 64UL << 20, 1000))
            {
                Assert(p.Info.Sandboxed == 1, "sandboxed");
                string got = CartPoleLoop(p);
                Assert(got == cLine.Replace("native", "sandboxed"), got);
            }
        });
        Test("the agents game over Agents.Tick prints what examples/agents.c prints (native and sandboxed)", () =>
        {
            using (var agents = Agents.Load(artifact, 7))
            {
                string got = AgentsGame(agents, false, 32, 1200);
                Console.WriteLine("     " + got.Split('\n')[1]);
                Assert(got == cAgents, "C# and C agents outputs differ:\nC#: " + got + "\nC:  " + cAgents);
            }
            using (var agents = Agents.FromPolicy(Policy.LoadSandboxed(artifact, plugin, 0, 1000), 7))
            {
                string got = AgentsGame(agents, true, 32, 1200);
                Assert(got == cAgents.Replace("native:", "sandboxed:"), "sandboxed agents differ");
            }
        });
        Test("agents from a policy on 2 threads (measured and always split) play the same game; an unknown split and the sandbox's threads are refused, typed", () =>
        {
            foreach (var split in new[] { ThreadSplit.Measured, ThreadSplit.Always })
            {
                var threaded = Policy.Load(artifact);
                threaded.SetThreads(2);
                threaded.SetThreadSplit(split);
                using (var agents = Agents.FromPolicy(threaded, 7))
                {
                    string got = AgentsGame(agents, false, 32, 1200);
                    Assert(got == cAgents, "2 threads, " + split + ": C# and C agents outputs differ:\nC#: " + got + "\nC:  " + cAgents);
                }
            }
            using (var p = Policy.Load(artifact))
            {
                var e = Throws<BadCallException>(() => p.SetThreadSplit((ThreadSplit)7), "thread split 7");
                Assert(e.Status == Status.BadCall, "status " + e.Status);
            }
            using (var p = Policy.LoadSandboxed(artifact, plugin, 0, 1000))
            {
                p.SetThreads(1);
                var e = Throws<PolicyportException>(() => p.SetThreads(2), "2 threads in the sandbox");
                Assert(e.Status == Status.Backend, "status " + e.Status);
                Throws<ArgumentOutOfRangeException>(() => p.SetThreads(-1), "-1 threads");
            }
        });
        Test("bad input is a typed exception, and the handle stays usable", () =>
        {
            Throws<InvalidArtifactException>(() => Policy.Load(new byte[] { 1, 2, 3 }), "junk bytes");
            Throws<ArgumentNullException>(() => Policy.Load(null), "null bytes");
            using (var p = Policy.Load(artifact))
            {
                var action = new long[1];
                Throws<ArgumentException>(() => p.Act(new float[3], new uint[] { 0 }, false, 0, 0, action, Span<float>.Empty, Span<float>.Empty), "3 floats for 4");
                Throws<ObservationException>(() => p.Act(new float[] { float.NaN, 0, 0, 0 }, new uint[] { 0 }, false, 0, 0, action, Span<float>.Empty, Span<float>.Empty), "NaN");
                p.Act(new float[4], new uint[] { 3 }, false, 0, 0, action, Span<float>.Empty, Span<float>.Empty);
                Assert(action[0] == 0 || action[0] == 1, "an action after the refused calls");
            }
            using (var agents = Agents.Load(artifact, 1))
            {
                ulong a = agents.Spawn();
                Throws<ArgumentException>(() => agents.Tick(new[] { a }, new float[5], new long[1], Span<float>.Empty, Span<float>.Empty), "5 floats for 4");
                Throws<BadCallException>(() => agents.Tick(new[] { a + (1UL << 32) }, new float[4], new long[1], Span<float>.Empty, Span<float>.Empty), "a forged id");
                Throws<BadCallException>(() => agents.Tick(new[] { a }, new float[4], new long[1], Span<float>.Empty, Span<float>.Empty, new byte[] { 0, 0 }), "a mask allowing nothing");
                var act = new long[1];
                agents.Tick(new[] { a }, new float[4], act, Span<float>.Empty, Span<float>.Empty, new byte[] { 0, 1 });
                Assert(act[0] == 1, "the mask allowing only action 1");
                Assert(agents.Info.Tick == 1 && agents.Info.Alive == 1, "one tick acted (the refused ones changed nothing)");
            }
        });
        Console.WriteLine(passed + " passed, " + failed + " failed");
        return failed == 0 ? 0 : 1;
    }
}

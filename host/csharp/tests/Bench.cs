// Per-tick cost of the C# binding: N agents, one Agents.Tick per tick (ids, observations in; actions
// out), median µs over ~0.3 s. Run by tests/scripts/engine-bench.sh:
//
//   mono Bench.exe <policy> <agents,...> [seconds]
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using Policyport;

static class Bench
{
    static int Main(string[] args)
    {
        byte[] artifact = File.ReadAllBytes(args[0]);
        double budget = args.Length > 2 ? double.Parse(args[2], System.Globalization.CultureInfo.InvariantCulture) : 0.3;
        foreach (string c in args[1].Split(','))
        {
            int n = int.Parse(c);
            using (var agents = Agents.Load(artifact, 1))
            {
                int o = agents.ObsLen, k = agents.ActionLen;
                var ids = new ulong[n];
                for (int i = 0; i < n; i++) ids[i] = agents.Spawn();
                var obs = new float[n * o];
                for (int i = 0; i < obs.Length; i++) obs[i] = (float)((i * 7919L) % 256);
                var actions = new long[n * k];
                // Actions only, as a game acts (an empty values span: the policy's critic is not run).
                agents.Tick(ids, obs, actions, Span<float>.Empty, Span<float>.Empty);
                var times = new List<double>();
                var total = Stopwatch.StartNew();
                while (times.Count < 5 || (total.Elapsed.TotalSeconds < budget && times.Count < 10000))
                {
                    var sw = Stopwatch.StartNew();
                    agents.Tick(ids, obs, actions, Span<float>.Empty, Span<float>.Empty);
                    times.Add(sw.Elapsed.TotalMilliseconds * 1000.0);
                }
                times.Sort();
                // (Concatenated: "{1:F2}}}" is ambiguous to .NET's format parser, which then prints "F2".)
                Console.WriteLine("{\"path\": \"csharp_tick\", \"agents\": " + n + ", \"us_per_tick\": " +
                    times[times.Count / 2].ToString("F2", System.Globalization.CultureInfo.InvariantCulture) + "}");
            }
        }
        return 0;
    }
}

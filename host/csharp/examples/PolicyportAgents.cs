// A Unity component driving many agents through one policy: one batched act() per FixedUpdate for every agent
// in the scene, whatever order Unity keeps them in. Drop Policyport.cs and this file into Assets/, the native
// library (libpolicyport_capi.so / policyport_capi.dll / libpolicyport_capi.dylib) into Assets/Plugins/, the
// .policy file into Assets/StreamingAssets/, and give each agent GameObject a component implementing
// IPolicyportAgent. (CI compiles this file against a stub of the few UnityEngine types it uses.)
using System.Collections.Generic;
using System.IO;
using UnityEngine;

namespace Policyport.Unity
{
    /// <summary>What an agent gives and takes each physics step.</summary>
    public interface IPolicyportAgent
    {
        /// <summary>Write this agent's observation (PolicyportAgents.ObsLen floats).</summary>
        void Observe(float[] obs, int offset);
        /// <summary>Apply the action the policy chose; return true when the agent's episode ended (it respawns).</summary>
        bool Apply(long[] actions, int offset);
    }

    public sealed class PolicyportAgents : MonoBehaviour
    {
        public string policyFile = "cartpole.policy";
        public ulong seed = 7;
        public bool sample = true;

        Agents agents;
        readonly List<IPolicyportAgent> members = new List<IPolicyportAgent>();
        readonly List<ulong> ids = new List<ulong>();
        ulong[] tickIds = new ulong[0];
        float[] obs = new float[0];
        long[] actions = new long[0];
        float[] values = new float[0];

        public int ObsLen => agents.ObsLen;

        void Awake()
        {
            byte[] bytes = File.ReadAllBytes(Path.Combine(Application.streamingAssetsPath, policyFile));
            agents = Agents.Load(bytes, seed, sample);
        }

        /// <summary>Add an agent (its first step starts a new episode).</summary>
        public void Register(IPolicyportAgent agent) { members.Add(agent); ids.Add(agents.Spawn()); }

        /// <summary>Remove an agent (its id dies; its recurrent memory is never handed to another agent).</summary>
        public void Unregister(IPolicyportAgent agent)
        {
            int i = members.IndexOf(agent);
            if (i < 0) return;
            agents.Despawn(ids[i]);
            members.RemoveAt(i);
            ids.RemoveAt(i);
        }

        void FixedUpdate()
        {
            int n = members.Count, o = agents.ObsLen, k = agents.ActionLen;
            if (n == 0) return;
            if (tickIds.Length < n)
            {
                tickIds = new ulong[n]; obs = new float[n * o]; actions = new long[n * k]; values = new float[n];
            }
            for (int i = 0; i < n; i++) { tickIds[i] = ids[i]; members[i].Observe(obs, i * o); }
            agents.Tick(new System.ReadOnlySpan<ulong>(tickIds, 0, n), new System.ReadOnlySpan<float>(obs, 0, n * o),
                new System.Span<long>(actions, 0, n * k), System.Span<float>.Empty, new System.Span<float>(values, 0, n));
            for (int i = 0; i < n; i++)
                if (members[i].Apply(actions, i * k)) agents.Respawn(ids[i]);
        }

        void OnDestroy() { agents?.Dispose(); }
    }
}

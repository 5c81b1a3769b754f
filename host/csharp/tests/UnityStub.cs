// The few UnityEngine types examples/PolicyportAgents.cs uses, so CI can compile it without Unity.
namespace UnityEngine
{
    public class Object { }
    public class Component : Object { }
    public class Behaviour : Component { }
    public class MonoBehaviour : Behaviour { }
    public static class Application { public static string streamingAssetsPath => "."; }
}

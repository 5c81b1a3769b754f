//! Many CartPoles in a headless Bevy app, each an entity acting through the bundled trained policy (one batched
//! act() per tick for all of them), respawning when their poles fall.
//!
//!     cargo run -p policyport-bevy --example cartpoles --release -- --agents 256
//!
//! Options: `--ticks T` (default 1000), `--out FILE` (the scene's last frame as a PNG, default cartpoles.png),
//! `--policy FILE` (another CartPole `.policy`; default: the bundled policy compiled from
//! tests/fixtures/cartpole), `--sandbox PLUGIN.wasm` (act inside the wasm sandbox). Prints the mean return of the
//! finished episodes and the time per tick (the whole `App::update`) and per act (the plugin's Act set).

use std::time::Instant;

use bevy_app::{App, Update};
use bevy_ecs::prelude::*;
use policyport::{Backend, CompiledPolicy};
use policyport_agents::{Agents, AgentsConfig};
use policyport_bevy::cartpole::{self, Cart, Scene};
use policyport_bevy::{Policies, PolicyportErrors, PolicyportPlugin, PolicyportSet};

#[derive(Resource, Default)]
struct Timing {
    start: Option<Instant>,
    act_us: Vec<f64>,
}

fn before_act(mut t: ResMut<Timing>) {
    t.start = Some(Instant::now());
}

fn after_act(mut t: ResMut<Timing>) {
    if let Some(s) = t.start.take() {
        t.act_us.push(s.elapsed().as_secs_f64() * 1e6);
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let agents_n: usize = arg(&args, "--agents").map_or(Ok(256), |v| v.parse())?;
    let ticks: u64 = arg(&args, "--ticks").map_or(Ok(1000), |v| v.parse())?;
    let out = arg(&args, "--out").unwrap_or_else(|| "cartpoles.png".into());
    let bytes = match arg(&args, "--policy") {
        Some(p) => std::fs::read(p)?,
        None => {
            // The bundled fixture: under the package `cargo run` names at run time, else under the current
            // directory (test.sh runs the binary from the repository's root), else where this was built (cargo
            // does not rebuild a moved clone, so the built-in path may be another clone's).
            let root = std::env::var("CARGO_MANIFEST_DIR")
                .map(|d| format!("{d}/../../tests/fixtures/cartpole"))
                .ok()
                .filter(|r| std::path::Path::new(r).is_dir())
                .or_else(|| {
                    let r = "tests/fixtures/cartpole".to_string();
                    std::path::Path::new(&r).is_dir().then_some(r)
                })
                .unwrap_or_else(|| {
                    concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/cartpole")
                        .to_string()
                });
            let onnx = std::fs::read(format!("{root}/policy.onnx"))?;
            let spec = serde_json::from_slice(&std::fs::read(format!("{root}/import.json"))?)?;
            policyport_import::compile_onnx(
                &onnx,
                &spec,
                "cartpole/policy.onnx",
                None,
                policyport_import::StorageDType::F32,
            )?
        }
    };
    let config = AgentsConfig {
        seed: 7,
        ..Default::default()
    };
    let policy = match arg(&args, "--sandbox") {
        Some(plugin) => {
            let rt = policyport_wasmtime::WasmRuntime::new(&std::fs::read(plugin)?)?;
            policyport_wasmtime::load(&rt, &bytes, Default::default())?
        }
        None => CompiledPolicy::load(&bytes, Backend::Cpu)?,
    };
    let agents = Agents::new(policy, config);
    let backend = agents.backend();

    let mut app = App::new();
    app.add_plugins(PolicyportPlugin::in_schedule(Update));
    app.init_resource::<Timing>();
    let policy = app.world_mut().resource_mut::<Policies>().add(agents);
    app.add_systems(
        Update,
        (
            cartpole::observe.in_set(PolicyportSet::Observe),
            before_act
                .after(PolicyportSet::Observe)
                .before(PolicyportSet::Act),
            after_act
                .after(PolicyportSet::Act)
                .before(PolicyportSet::Apply),
            cartpole::apply.in_set(PolicyportSet::Apply),
        ),
    );
    cartpole::spawn_scene(app.world_mut(), Scene::new(agents_n, policy, None));
    let mut tick_us = vec![];
    for _ in 0..ticks {
        let t0 = Instant::now();
        app.update();
        tick_us.push(t0.elapsed().as_secs_f64() * 1e6);
        if let Some((_, e)) = app.world().resource::<PolicyportErrors>().0.first() {
            return Err(format!("policyport refused a tick: {e}").into());
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let scene = app.world().resource::<Scene>().clone();
    let mut act_us = app.world().resource::<Timing>().act_us.clone();
    println!(
        "{agents_n} agents on {backend}, {ticks} ticks: {} episodes finished, mean return {:.2}; per tick (median) \
         {:.1} us for the whole update, {:.1} us for the Act set ({:.3} us per agent)",
        scene.returns.len(),
        scene.mean_return(),
        median(&mut tick_us),
        median(&mut act_us),
        median(&mut act_us) / agents_n as f64
    );
    let mut carts: Vec<Cart> = app
        .world_mut()
        .query::<&Cart>()
        .iter(app.world())
        .cloned()
        .collect();
    carts.sort_by_key(|c| c.slot);
    std::fs::write(&out, render(&carts))?;
    println!("wrote {out} (the scene's last frame)");
    Ok(())
}

/// The carts on a grid of cells: a track, the cart at its position, the pole at its angle.
fn render(carts: &[Cart]) -> Vec<u8> {
    let (cw, ch) = (64usize, 48usize);
    let cols = (carts.len() as f64).sqrt().ceil().max(1.0) as usize;
    let rows = carts.len().div_ceil(cols).max(1);
    let (w, h) = (cols * cw, rows * ch);
    let mut img = vec![245u8; w * h * 3];
    let mut put = |x: i64, y: i64, c: [u8; 3]| {
        if x >= 0 && y >= 0 && (x as usize) < w && (y as usize) < h {
            let i = (y as usize * w + x as usize) * 3;
            img[i..i + 3].copy_from_slice(&c);
        }
    };
    for (k, cart) in carts.iter().enumerate() {
        let (ox, oy) = ((k % cols * cw) as i64, (k / cols * ch) as i64);
        let track = oy + 38;
        for x in 2..cw as i64 - 2 {
            put(ox + x, track, [120, 120, 120]);
        }
        // x in [-2.4, 2.4] across the cell.
        let cx = ox + (cw as f64 / 2.0 + cart.state[0] / 2.4 * (cw as f64 / 2.0 - 6.0)) as i64;
        for dx in -5..=5 {
            for dy in -3..=0 {
                put(cx + dx, track - 1 + dy, [40, 90, 200]);
            }
        }
        let theta = cart.state[2];
        for s in 0..28 {
            let px = cx as f64 + s as f64 * theta.sin();
            let py = (track - 4) as f64 - s as f64 * theta.cos();
            put(px.round() as i64, py.round() as i64, [200, 80, 40]);
        }
    }
    png_rgb(w, h, &img)
}

/// An RGB PNG with stored (uncompressed) deflate blocks: no image crate for a debug frame.
fn png_rgb(w: usize, h: usize, rgb: &[u8]) -> Vec<u8> {
    fn crc32(data: &[u8]) -> u32 {
        let mut c = 0xFFFF_FFFFu32;
        for b in data {
            c ^= *b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        out.extend_from_slice(&body);
        out.extend_from_slice(&crc32(&body).to_be_bytes());
    }
    let mut raw = Vec::with_capacity(h * (w * 3 + 1));
    for row in rgb.chunks(w * 3) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut z = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = raw.chunks(65_535).collect();
    for (i, b) in blocks.iter().enumerate() {
        z.push(u8::from(i + 1 == blocks.len()));
        z.extend_from_slice(&(b.len() as u16).to_le_bytes());
        z.extend_from_slice(&(!(b.len() as u16)).to_le_bytes());
        z.extend_from_slice(b);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for v in &raw {
        a = (a + *v as u32) % 65_521;
        b = (b + a) % 65_521;
    }
    z.extend_from_slice(&((b << 16) | a).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = vec![];
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    chunk(&mut out, b"IDAT", &z);
    chunk(&mut out, b"IEND", &[]);
    out
}

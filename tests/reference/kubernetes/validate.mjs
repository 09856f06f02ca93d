// Offline validation of Kubernetes objects against the API's own schemas, for flashdraft's
// manifests (tests/kubernetes_test.cc renders each overlay with `kubectl kustomize` and runs this):
//  1. the JSON schemas of the Kubernetes 1.32 API and the Prometheus Operator's CRDs, as
//     kubernetes-models ships them (types, required fields, enums, formats): Model.validate();
//  2. strict, as kubeconform -strict: no field the API does not know. The schemas allow unknown
//     fields, so each object is also type-checked by TypeScript against the models' interface of
//     its kind, whose excess-property check names a field the kind does not have (the first of
//     each object: fix it and run again).
// A PyTorchJob (Kubeflow) is checked as pytorchJobParts says.
// Usage: node validate.mjs FILE...  (YAML streams). One line per object; exit 1 on any error.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import YAML from "yaml";
import ts from "typescript";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);

// The module of an apiVersion's kinds (loadModel finds none for one the models do not have).
function modelModule(apiVersion) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  return group === "monitoring.coreos.com"
    ? `@kubernetes-models/prometheus-operator/${group}/${version}`
    : `kubernetes-models/${group ? group + "/" : ""}${version}`;
}

function loadModel(apiVersion, kind) {
  const module = `${modelModule(apiVersion)}/${kind}`;
  try {
    return { module, Model: require(module)[kind] };
  } catch {
    return { module, Model: undefined };
  }
}

function readObjects(files) {
  const objects = [];
  for (const file of files) {
    for (const doc of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
      if (doc.errors.length > 0) throw new Error(`${file}: ${doc.errors[0].message}`);
      const object = doc.toJS();
      if (object === null) continue;
      if (object.apiVersion === "kubeflow.org/v1" && object.kind === "PyTorchJob") {
        objects.push(...pytorchJobParts(file, object));
      } else {
        objects.push({ file, object });
      }
    }
  }
  return objects;
}

// Kubeflow's PyTorchJob: its CRD's schema is on no registry this project uses. Its fields are
// checked against the training operator's kubeflow.org/v1 API here, and each replica's pod
// template, a core PodTemplateSpec, is validated as a PodTemplate object.
const kPyTorchJobFields = {
  "": ["apiVersion", "kind", "metadata", "spec"],
  spec: ["runPolicy", "pytorchReplicaSpecs", "elasticPolicy", "nprocPerNode"],
  runPolicy: ["cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit",
              "schedulingPolicy", "suspend", "managedBy"],
  replica: ["replicas", "template", "restartPolicy"],
};

function pytorchJobParts(file, job) {
  const name = job.metadata?.name ?? "?";
  const unknown = [];
  const expect = (object, fields, where) => {
    for (const key of Object.keys(object ?? {})) {
      if (!fields.includes(key)) unknown.push(`${where}${key}`);
    }
  };
  expect(job, kPyTorchJobFields[""], "/");
  expect(job.spec, kPyTorchJobFields.spec, "/spec/");
  expect(job.spec?.runPolicy, kPyTorchJobFields.runPolicy, "/spec/runPolicy/");
  const parts = [];
  for (const [type, replica] of Object.entries(job.spec?.pytorchReplicaSpecs ?? {})) {
    const where = `/spec/pytorchReplicaSpecs/${type}/`;
    if (!["Master", "Worker"].includes(type)) unknown.push(`/spec/pytorchReplicaSpecs/${type}`);
    expect(replica, kPyTorchJobFields.replica, where);
    if (!["Always", "OnFailure", "Never", "ExitCode"].includes(replica.restartPolicy)) {
      unknown.push(`${where}restartPolicy ${replica.restartPolicy}`);
    }
    if (!replica.template?.spec?.containers?.some((c) => c.name === "pytorch")) {
      unknown.push(`${where}template has no container named pytorch`);
    }
    const template = { apiVersion: "v1", kind: "PodTemplate", template: replica.template };
    parts.push({ file, object: { ...template, metadata: { name: `${name} ${type}` } } });
  }
  const envelope = { file, object: { kind: "PyTorchJob", metadata: job.metadata }, unknown };
  return [envelope, ...parts];
}

function describe({ object }) {
  return `${object?.kind ?? "?"}/${object?.metadata?.name ?? "?"}`;
}

// Adds each object's schema errors to errors[i]; returns the known kinds' modules, for the
// type check.
function checkSchemas(objects, errors) {
  const typed = [];
  objects.forEach((entry, i) => {
    if (entry.unknown !== undefined) {  // a PyTorchJob's own fields
      errors[i].push(...entry.unknown.map((field) => `${field}: not in kubeflow.org/v1`));
      return;
    }
    const { apiVersion, kind } = entry.object ?? {};
    if (typeof apiVersion !== "string" || typeof kind !== "string") {
      errors[i].push("no apiVersion or kind");
      return;
    }
    const { module, Model } = loadModel(apiVersion, kind);
    if (Model === undefined) {
      errors[i].push(`unknown kind ${kind} of ${apiVersion}`);
      return;
    }
    try {
      new Model(entry.object).validate();
    } catch (e) {
      for (const err of e.errors ?? [{ instancePath: "", message: e.message }]) {
        errors[i].push(`${err.instancePath || "/"} ${err.message}${paramsText(err.params)}`);
      }
    }
    typed.push({ index: i, module, kind });
  });
  return typed;
}

function paramsText(params) {
  if (!params) return "";
  if (params.allowedValues) return ` (${params.allowedValues.join(", ")})`;
  if (params.missingProperty) return ` (${params.missingProperty})`;
  return "";
}

// TypeScript's excess-property and type errors of each object against its kind's interface.
function checkStrict(objects, typed, errors) {
  const virtual = path.join(here, "__objects__.ts");
  const lines = [];
  const owner = [];  // the object of each line
  for (const { index, module, kind } of typed) {
    lines.push(`import type { I${kind} as T${index} } from "${module}";`);
    owner.push(index);
    const literal = JSON.stringify(objects[index].object, null, 1);
    for (const line of `const o${index}: T${index} = ${literal};`.split("\n")) {
      lines.push(line);
      owner.push(index);
    }
  }
  const source = lines.join("\n");
  const options = {
    strict: true,
    noEmit: true,
    moduleResolution: ts.ModuleResolutionKind.Node10,
    module: ts.ModuleKind.ESNext,
    target: ts.ScriptTarget.ES2020,
    skipLibCheck: true,
    types: [],
  };
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile;
  host.getSourceFile = (name, language, ...rest) =>
    name === virtual
      ? ts.createSourceFile(name, source, language)
      : getSourceFile(name, language, ...rest);
  const fileExists = host.fileExists;
  host.fileExists = (name) => name === virtual || fileExists(name);
  const program = ts.createProgram([virtual], options, host);
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const message = ts.flattenDiagnosticMessageText(d.messageText, " ");
    if (d.file?.fileName !== virtual || d.start === undefined) {
      throw new Error(`the type check itself failed: ${message}`);
    }
    const { line } = d.file.getLineAndCharacterOfPosition(d.start);
    errors[owner[line]].push(`${message} (at: ${lines[line].trim().slice(0, 80)})`);
  }
}

function main(files) {
  if (files.length === 0) {
    console.error("usage: node validate.mjs FILE...");
    return 2;
  }
  const objects = readObjects(files);
  const errors = objects.map(() => []);
  const typed = checkSchemas(objects, errors);
  checkStrict(objects, typed, errors);
  let failed = 0;
  objects.forEach((entry, i) => {
    if (errors[i].length === 0) {
      console.log(`valid: ${describe(entry)} (${entry.object.apiVersion ?? "kubeflow.org/v1"})`);
      return;
    }
    ++failed;
    for (const e of errors[i]) console.log(`invalid: ${describe(entry)} in ${entry.file}: ${e}`);
  });
  console.log(`${objects.length - failed} of ${objects.length} object(s) valid`);
  return failed === 0 && objects.length > 0 ? 0 : 1;
}

try {
  process.exitCode = main(process.argv.slice(2));
} catch (e) {
  console.error(`validate.mjs: ${e.message}`);
  process.exitCode = 2;
}

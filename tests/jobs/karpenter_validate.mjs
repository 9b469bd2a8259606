// Validates Karpenter NodePools (a JSON list on stdin) against @kubernetes-models/karpenter's
// validators, which are compiled from Karpenter's CRD; prints one JSON list of messages per object
// ([] when valid). KARPENTER_MODELS names the folder npm installed the package under (the Makefile's).
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const module = path.join(process.env.KARPENTER_MODELS, "node_modules/@kubernetes-models/karpenter/karpenter.sh/v1/NodePool.js");
const { NodePool } = await import(pathToFileURL(module).href);
const results = JSON.parse(readFileSync(0, "utf8")).map((object) => {
  try {
    new NodePool(object).validate();
    return [];
  } catch (error) {
    return String(error.message).split("\n");
  }
});
console.log(JSON.stringify(results));

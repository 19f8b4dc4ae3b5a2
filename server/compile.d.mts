/** server/compile.mjs: compiles one of our modules as `npm start` compiles the server. */
export function compile(options: {
  /** The module to compile, a path from the repository's root (e.g. `server/main.ts`). */
  entry: string;
  /** The build's name: its folder in `node_modules/.cache/service-api/` is `<name>-<content hash>`. */
  name: string;
  /** Linked source maps beside the chunks. */
  sourceMaps: boolean;
  /** Told how long the build took and where it went. */
  log?: (message: string) => void;
}): Promise<string | undefined>;

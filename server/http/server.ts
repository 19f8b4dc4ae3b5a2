/**
 * createHttpServer(app): the `node:http` server of an Express application whose requests and responses are
 * built on the application's own prototypes (`app.request`, `app.response`) from the start.
 *
 * Express makes each request and response its own at the start of every request with
 * `Object.setPrototypeOf(req, app.request)` (and `res`). V8 then moves each object to a new hidden class, and
 * the lookups Node's HTTP code and every middleware make on it afterwards miss their inline caches. Measured on
 * this VM (one Express middleware writing a small JSON answer, autocannon, 16 connections): bare `node:http`
 * 15,000-20,000 requests/s, the same through Express 4,100-4,900, and through Express with the objects built
 * on its prototypes 10,900-15,000. Express's `setPrototypeOf` still runs; finding the prototype it sets
 * already there, it changes nothing. Same objects and same Express otherwise: only when the prototype is set
 * differs. (Express swaps prototypes again around a mounted sub-application; this server has none on its hot
 * path.)
 *
 * An application with an entry of its own (`serve`, app.ts: its one layer and its error handler without
 * Express's dispatch, for objects born on its prototypes) is served through that entry; any other through
 * Express as ever.
 */
import { createServer, IncomingMessage, type Server, type ServerOptions, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Express } from 'express';
import { extend } from '../objects.ts';

export function createHttpServer(app: Express, options: ServerOptions = {}): Server {
  // Function constructors, not classes: the instances' prototype must be exactly Express's object.
  function AppRequest(this: IncomingMessage, socket: Socket) {
    Reflect.apply(IncomingMessage, this, [socket]);
  }
  AppRequest.prototype = app.request;
  function AppResponse(this: ServerResponse, req: IncomingMessage, responseOptions?: object) {
    // Node passes the response's options (high-water mark, body checks): handed on as they come.
    Reflect.apply(ServerResponse, this, [req, responseOptions]);
  }
  AppResponse.prototype = app.response;
  // Static inheritance, as Node gives its own constructors: V8 sizes the objects a constructor makes from the
  // properties its prototype chain of constructors assigns (IncomingMessage's and Readable's, ServerResponse's
  // and OutgoingMessage's); a function whose own assigns nothing makes objects with room for a few only, whose
  // other fields then go to a backing store, and the keyed stores of Node's symbol fields past the twelfth of
  // those turn the object into a dictionary (slow mode) in its constructor, for the rest of the request.
  Object.setPrototypeOf(AppRequest, IncomingMessage);
  Object.setPrototypeOf(AppResponse, ServerResponse);
  return createServer(
    extend(options, {
      IncomingMessage: AppRequest as unknown as typeof IncomingMessage,
      ServerResponse: AppResponse as unknown as typeof ServerResponse,
    }),
    // The application's own entry when it has one (app.ts `serve`: its steps without Express's dispatch).
    (app as Express & { serve?: (req: IncomingMessage, res: ServerResponse) => void }).serve ?? app,
  );
}

/**
 * The catalogue operations: models, traits, the OpenAI compatibility mapping, image styles and characters.
 * Pure reads of the loaded catalogue.
 */
import type { CatalogService } from '../../catalog/service.ts';
import type { HandlerTable } from '../../http/contract.ts';
import { notFound } from '../../http/errors.ts';

type CatalogOps =
  | 'listModels'
  | 'listModelTraits'
  | 'listModelCompatibilityMapping'
  | 'listImageStyles'
  | 'listCharacters'
  | 'getCharacter';

export function createCatalogHandlers(catalog: CatalogService): Pick<HandlerTable, CatalogOps> {
  return {
    async listModels({ query }) {
      return { status: 200, body: catalog.listModels(query.type ?? 'text') };
    },
    async listModelTraits({ query }) {
      return { status: 200, body: catalog.listTraits(query.type ?? 'text') };
    },
    async listModelCompatibilityMapping({ query }) {
      return { status: 200, body: catalog.listCompatibility(query.type ?? 'text') };
    },
    async listImageStyles() {
      return { status: 200, body: catalog.imageStyles() };
    },
    async listCharacters({ query }) {
      const limit = query.limit ?? 50;
      const offset = query.offset ?? 0;
      const { items, total } = catalog.listCharacters({ ...query, limit, offset });
      return {
        status: 200,
        body: { object: 'list', data: items },
        headers: {
          'x-pagination-limit': limit,
          'x-pagination-page': Math.floor(offset / limit) + 1,
          'x-pagination-total': total,
          'x-pagination-total-pages': Math.ceil(total / limit),
        },
      };
    },
    async getCharacter({ path }) {
      const character = catalog.getCharacter(path.slug);
      if (!character) throw notFound(`No character with slug or id '${path.slug}'`, 'CHARACTER_NOT_FOUND');
      return { status: 200, body: { object: 'character', data: character } };
    },
  };
}
